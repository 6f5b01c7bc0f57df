"""Triton's interpreter without its repeated patching of triton.language, for the CPU tier.

Data path: a kernel launch under the interpreter (GridExecutor.__call__) patches the language
modules its kernel's globals name (triton.language, triton.language.core) for the run and restores
them after; triton 3.9 patches them again at every call of a nested @triton.jit function (tl.zeros,
the stages' helpers), an inspect.getmembers walk over each module that was a third to a half of
the CPU tier's interpreter time. Here a nested call whose modules the running launch has already
patched skips that walk; a call that names a module not patched yet (tl.zeros reaches
triton.language.core) patches as before. Results are the same bits (tests/cpu/test_interpreter_patching.py
holds runs with and without it to that).

Also: the interpreter's options ask for integer overflow checks (sanitize_overflow) but not for
debug, and without debug its device_assert returns before checking; so each int32 add, sub and mul
computed its operands again in int64, compared them with the bounds and dropped the result (about
half of the interpreter's time on the references' index arithmetic). With debug off the check is
turned off too: nothing is checked either way.

And: the interpreter maps a Triton type to its numpy dtype (_get_np_dtype) by building a dict of
every type at each call, some 90,000 calls in one recorded attention trace's judgement; the map is
kept per scalar type here (a block's is its element's, as there; pointers are left to it).

And: every operation builds its result's types anew: a block type unwraps and validates its shape
and formats its name, a tensor makes a constexpr of each dimension and a tuple type of them, some
200,000 of each in one recorded attention trace's judgement. Both are made here from what was
computed for the same shape before (a shape of plain ints; any other is built as there): the same
attribute values, fresh tuple objects each time, as there. And the implicit broadcast of two blocks of
one shape (a third of the binary operations' broadcasts) returns them as they are, as it does there,
without the comparisons of Triton tuples it makes to find that out.

Constraints: only for the triton minor versions whose interpreter was read for this (the
functions it wraps exist and are looked up by name at call time); any other version is left as
it is. One launch at a time per thread, as the interpreter itself requires.
"""

from __future__ import annotations

import dataclasses
import threading

CHECKED_TRITON = ((3, 9),)

_state = threading.local()
_saved: dict = {}
skipped = [0]  # nested calls that found their modules patched (a test reads it)


class _Nothing:
    def restore(self) -> None:
        pass


def _version() -> tuple[int, int]:
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def install() -> bool:
    """Wrap the interpreter's patching; False (nothing changed) when it does not apply."""
    import os

    if _saved or os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or _version() not in CHECKED_TRITON:
        return bool(_saved)
    import triton.language as tl
    from triton.runtime import interpreter as interp

    patch_lang, run = interp._patch_lang, interp.GridExecutor.__call__
    langs_of: dict = {}

    def langs(fn) -> frozenset:
        got = langs_of.get(fn)
        if got is None:
            got = langs_of[fn] = frozenset(id(v) for v in list(fn.__globals__.values()) if v is tl or v is tl.core)
        return got

    def _patch_lang(fn):
        if getattr(_state, "runs", 0):
            mine = langs(fn)
            if mine and mine <= _state.patched:
                skipped[0] += 1
                return _Nothing()
            scope = patch_lang(fn)
            _state.patched = _state.patched | mine
            return scope
        return patch_lang(fn)

    def __call__(self, *args, **kwargs):
        before = (getattr(_state, "runs", 0), getattr(_state, "patched", frozenset()))
        _state.runs, _state.patched = before[0] + 1, frozenset()
        try:
            return run(self, *args, **kwargs)
        finally:
            _state.runs, _state.patched = before

    np_dtype, np_dtypes = interp._get_np_dtype, {}

    def _get_np_dtype(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype  # a block: its element's
        got = np_dtypes.get(scalar) if not isinstance(scalar, tl.pointer_type) else None
        if got is None:
            got = np_dtype(tt_dtype)
            if not isinstance(scalar, tl.pointer_type):  # pointers (uint64) cannot be hashed
                np_dtypes[scalar] = got
        return got

    _saved.update(patch_lang=patch_lang, run=run, np_dtype=np_dtype, block_init=tl.core.block_type.__init__,
                  tensor_init=tl.core.tensor.__init__)
    _cache_shapes(tl.core)
    from triton.language import semantic

    broadcast = _saved["broadcast"] = semantic.TritonSemantic.broadcast_impl_value

    def broadcast_impl_value(self, lhs, rhs):
        lt, rt = lhs.type, rhs.type
        if lt.is_block() and rt.is_block() and list(lt.shape) == list(rt.shape):
            return lhs, rhs  # what the general case returns for equal shapes
        return broadcast(self, lhs, rhs)

    semantic.TritonSemantic.broadcast_impl_value = broadcast_impl_value
    interp._patch_lang = _patch_lang
    interp.GridExecutor.__call__ = __call__
    interp._get_np_dtype = _get_np_dtype
    options = interp.interpreter_builder.options
    if options.sanitize_overflow and not options.debug:
        _saved["options"] = options
        interp.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def _cache_shapes(core) -> None:
    """block_type and tensor built from what was computed for the same shape (module docstring)."""
    import math

    block_init = core.block_type.__init__
    blocks: dict = {}  # dims -> (dims, the shape's tuple type, numel, str(shape))
    tensors: dict = {}  # dims -> (constexpr per dim, their tuple type, constexpr numel)

    def dims_of(shape):
        values = shape.values if type(shape) is core.tuple else shape if type(shape) is list else None  # as there
        if values is None:
            return None
        for v in values:
            if type(v) is not int:
                out = tuple(v.value if type(v) is core.constexpr else v for v in values)
                return out if all(type(d) is int for d in out) else None
        return tuple(values)

    def block_type_init(self, element_ty, shape):
        key = dims_of(shape)
        got = blocks.get(key) if key is not None else None
        if got is None:
            block_init(self, element_ty, shape)
            if key is not None:
                blocks[key] = (list(self.shape.values), self.shape.type, self.numel, str(self.shape))
            return
        self.element_ty = element_ty
        self.shape = core.tuple(got[0], got[1])  # a fresh list of the values, as tuple() makes
        self.numel = got[2]
        self.name = f"<{got[3]}, {element_ty}>"

    def tensor_init(self, handle, type):
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        key = tuple(getattr(type.shape, "values", type.shape)) if type.is_block() else ()
        got = tensors.get(key)
        if got is None:
            values = [core.constexpr(s) for s in key]
            got = tensors[key] = (values, core.tuple(values).type, core.constexpr(math.prod(key)))
        self.shape = core.tuple(got[0], got[1])
        self.numel = got[2]

    core.block_type.__init__ = block_type_init
    core.tensor.__init__ = tensor_init


def uninstall() -> None:
    """Put the interpreter's own functions back."""
    if not _saved:
        return
    from triton.runtime import interpreter as interp

    interp._patch_lang = _saved.pop("patch_lang")
    interp._get_np_dtype = _saved.pop("np_dtype")
    interp.GridExecutor.__call__ = _saved.pop("run")
    import triton.language as tl

    tl.core.block_type.__init__ = _saved.pop("block_init")
    tl.core.tensor.__init__ = _saved.pop("tensor_init")
    from triton.language import semantic

    semantic.TritonSemantic.broadcast_impl_value = _saved.pop("broadcast")
    if "options" in _saved:
        interp.interpreter_builder.options = _saved.pop("options")
