"""Triton interpreter launches served again from memory, for the CPU tier.

Under the interpreter a launch is a function of what it is handed: the bytes its tensor arguments
span (each from its first element to its last, in its storage), their dtypes, shapes and strides,
which of them share a storage and at what distance, its other arguments, its grid, and its code (the
kernel's function and every global its code or its nested @triton.jit helpers name, by identity or
value). A launch seen before with all of that equal writes what it wrote then: each span it changed
gets the bytes it had after it. The references' kernels read and write through the tensors they are
handed, within their extents (masked by the shapes they are given); a kernel that reaches past a
tensor's last element is outside what the key covers.

Judgements of one problem's dumps (a correct kernel and its defects) run their references on the same
inputs, and the cross-check and the stages launch the same reference on the same tiles: most of the
CPU tier's repeated interpreter time is such launches. torch.empty's bytes are filled while the memo
is installed (torch's deterministic mode, warnings only), so that an output buffer's bytes before a
launch, part of its key, are the same each time.

Not kept: a launch that raised (it runs again, and raises again), one with an argument of a kind not
listed above or a tensor off the CPU, and one whose changed spans hold more than ENTRY_BYTES; what is
kept is bounded (MEMO_BYTES, oldest out first). Tests whose subject is the interpreter's own
execution (tests/cpu/test_interpreter_patching.py) take the memo off. The memo reads and writes spans
through their addresses, not torch's dispatcher, so a dispatch mode counting a test's host reads and
aten ops sees none of its own work (a served launch makes none of the interpreter's copies either).
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import inspect
import types
from contextlib import contextmanager

ENTRY_BYTES = 64 << 20  # the most bytes one launch's changed storages may have to be kept
MEMO_BYTES = 512 << 20  # the most bytes kept in all

_state = {"on": False, "run": None, "deterministic": None}
_memo: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_held = [0]
stats = collections.Counter()  # hits, misses, unkept (a test reads it)


class _NoKey(Exception):
    """A launch that is not memoised (an argument of a kind the key does not cover)."""


def _span(address: int, start: int, end: int) -> memoryview:
    if end <= start:
        return memoryview(b"")
    return memoryview((ctypes.c_char * (end - start)).from_address(address + start)).cast("B")


def _digest(view: memoryview) -> bytes:
    return hashlib.blake2b(view, digest_size=16).digest()


class _Key:
    """The parts of one launch's arguments, and the byte spans its tensors hand the kernel: each
    tensor's, from its first element to its last, in its storage; tensors of one storage are keyed
    by their offsets from the first of them, so that aliasing is part of the key."""

    def __init__(self, torch):
        self.torch = torch
        self.storages: dict = {}  # storage address -> (its index, the first byte offset seen in it)
        self.spans: list = []  # (storage address, first byte, end byte), distinct

    def arg(self, a):
        kind = type(a)
        if kind in (int, float, bool, str, type(None)):
            return (kind, a.hex() if kind is float else a)
        if kind is self.torch.Tensor:
            if a.device.type != "cpu" or a.layout is not self.torch.strided or a.is_quantized or a.is_nested:
                raise _NoKey("tensor")
            size = a.element_size()
            address = a.untyped_storage().data_ptr()
            first = a.storage_offset() * size
            end = first + (1 + sum((n - 1) * st for n, st in zip(a.shape, a.stride()))) * size if a.numel() else first
            span = (address, first, end)
            if span not in self.spans:
                self.spans.append(span)
            index, base = self.storages.setdefault(address, (len(self.storages), first))
            return ("T", a.dtype, tuple(a.shape), a.stride(), index, first - base)
        if isinstance(a, tuple):  # tuples and NamedTuples (the references' constant bundles)
            return (kind, tuple(self.arg(v) for v in a))
        if kind is self.torch.dtype:
            return (kind, a)
        module = getattr(kind, "__module__", "")
        if module.startswith("triton.language") and getattr(a, "name", None) is not None:  # a tl dtype
            return (kind, str(a))
        if kind.__name__ == "constexpr" and module.startswith("triton.language"):
            return ("C", self.arg(a.value))
        raise _NoKey(kind.__name__)

    def views(self) -> list:
        return [_span(*span) for span in self.spans]


_code_names: dict = {}  # function -> (its globals, the names its code and nested code read)


def _names_of(fn):
    got = _code_names.get(fn)
    if got is None:
        names, todo = set(), [fn.__code__]
        while todo:
            code = todo.pop()
            names.update(code.co_names)
            todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        got = _code_names[fn] = (fn.__globals__, tuple(sorted(names)))
    return got


def _code_key(fn, seen=None) -> tuple:
    """The function and what its code reads by name: each global, and each attribute of a global
    module that its code names (`C.helper`, `tl.load`): a @triton.jit helper by its own code key,
    a plain value by value, anything else by identity (kept alive by the key) or, unhashable, by repr."""
    seen = set() if seen is None else seen
    if fn in seen:
        return (fn,)
    seen.add(fn)
    glob, names = _names_of(fn)
    parts = [fn]
    for name in names:
        if name not in glob:
            continue
        v = glob[name]
        parts.append((name, _value_key(v, seen)))
        if isinstance(v, types.ModuleType):
            parts.extend((name, attr, _value_key(getattr(v, attr), seen)) for attr in names if hasattr(v, attr))
    return tuple(parts)


def _value_key(v, seen):
    inner = getattr(v, "fn", None)
    if isinstance(inner, types.FunctionType) and hasattr(v, "run"):  # a nested jit function
        return _code_key(inner, seen)
    if type(v) in (int, float, bool, str, type(None)):
        return (type(v), v)
    try:
        hash(v)
    except TypeError:
        return (type(v), repr(v))
    return v


def _launch_key(executor, args, kwargs, torch):
    fn = executor.fn
    spec = inspect.getfullargspec(fn)
    kwargs = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
    grid = executor.grid
    if callable(grid):
        grid = grid(inspect.getcallargs(fn, *args, **kwargs))
    key = _Key(torch)
    parts = (_code_key(fn), tuple(grid), tuple(key.arg(a) for a in args),
             tuple(sorted((k, key.arg(v)) for k, v in kwargs.items())))
    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    return (parts, options), key.views()


def install() -> bool:
    """Serve repeated interpreter launches from memory; False where the package's kernels are not
    interpreted."""
    if _state["run"] is not None:
        return True
    from kernels_ref._common import interpreting

    if not interpreting():
        return False
    import torch
    from triton.runtime import interpreter

    _state["deterministic"] = (torch.are_deterministic_algorithms_enabled(),
                               torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # torch.empty filled (module docstring)
    run = _state["run"] = interpreter.GridExecutor.__call__

    def __call__(self, *args, **kwargs):
        if not _state["on"]:
            return run(self, *args, **kwargs)
        try:
            key, views = _launch_key(self, args, kwargs, torch)
            before = [_digest(v) for v in views]
            key = (key, tuple(before))
            hash(key)
        except Exception:  # _NoKey, an unhashable part, a grid function that wants the launch's own arguments
            stats["unkept"] += 1
            return run(self, *args, **kwargs)
        entry = _memo.get(key)
        if entry is not None:
            _memo.move_to_end(key)
            for slot, data in entry[0]:
                views[slot][:] = data
            stats["hits"] += 1
            return None
        run(self, *args, **kwargs)
        stats["misses"] += 1
        changed = [(slot, bytes(v)) for slot, v in enumerate(views) if _digest(v) != before[slot]]
        size = sum(len(d) for _, d in changed)
        if size <= ENTRY_BYTES:
            _memo[key] = (changed, size)
            _held[0] += size
            while _held[0] > MEMO_BYTES and _memo:
                _, (_, dropped) = _memo.popitem(last=False)
                _held[0] -= dropped
        return None

    interpreter.GridExecutor.__call__ = __call__
    _state["on"] = True
    return True


def uninstall() -> bool:
    """The interpreter's own launch again, and nothing kept; whether it was installed."""
    was = _state["run"] is not None
    if was:
        from triton.runtime import interpreter

        interpreter.GridExecutor.__call__ = _state["run"]
        _state["run"] = None
        import torch

        on, warn_only = _state["deterministic"]
        torch.use_deterministic_algorithms(on, warn_only=warn_only)
    _state["on"] = False
    _memo.clear()
    _held[0] = 0
    return was


@contextmanager
def paused():
    """Every launch inside runs in the interpreter (and none is kept)."""
    on = _state["on"]
    _state["on"] = False
    try:
        yield
    finally:
        _state["on"] = on
