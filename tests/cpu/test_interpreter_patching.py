"""The CPU tier's interpreter patching (tests/interpreter_patching.py) changes no result: the
reference stages give the same bits with the interpreter's own patching and with the patched-once
launch, and the nested calls it skips are skipped."""

import pytest
import torch

import interpreter_patching as P  # tests/ is on sys.path
import launch_memo
from kernels_ref import epilogue as E
from kernels_ref import mma as X


@pytest.fixture(autouse=True)
def _every_launch_interpreted():
    """The subject is the interpreter's own execution: no launch is served from memory, and the
    memo's wrapper is taken off while the patching is taken off and put back."""
    was = launch_memo.uninstall()
    try:
        yield
    finally:
        if was:
            assert launch_memo.install()


def _runs():
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(40, 96, generator=g) * 2).to(torch.bfloat16)
    b = (torch.randn(96, 24, generator=g) * 2).to(torch.bfloat16)
    acc = X.mma_accumulate(a, b, 16, 16, 32, acc="fp32")
    fp16 = X.mma_accumulate(a.to(torch.float16), b.to(torch.float16), 16, 16, 32, acc="fp16")
    step = X.mma_step(None, a[:16, :32], b[:32, :16], acc="fp32")
    big = torch.full((16, 64), 127, dtype=torch.int8)
    wraps = X.mma_step(torch.full((16, 16), 2**31 - 1000, dtype=torch.int32), big, big.t().contiguous(), acc="int32")
    out = E.apply_cast(E.apply_activation(E.apply_alpha_beta(acc, 0.5), "gelu_tanh"), "bf16")
    return [acc, fp16, step, out, wraps]


def test_the_patched_once_launch_gives_the_interpreters_bits():
    if not P.install():
        pytest.skip("The patching applies only under the interpreter of the triton versions it was read for.")
    before = P.skipped[0]
    patched = _runs()
    assert P.skipped[0] > before, "no nested call was skipped: the patching is not in the path"
    from triton.runtime import interpreter

    patched_options = interpreter.interpreter_builder.options
    assert not patched_options.sanitize_overflow and not patched_options.debug
    P.uninstall()
    assert interpreter.interpreter_builder.options.sanitize_overflow  # the interpreter's own again
    assert interpreter._get_np_dtype.__module__ == "triton.runtime.interpreter"  # its own type map again
    import triton.language as tl

    for cls in (tl.core.block_type, tl.core.tensor):  # its own type and tensor construction again
        assert cls.__init__.__module__ == "triton.language.core", cls
    from triton.language import semantic

    assert semantic.TritonSemantic.broadcast_impl_value.__module__ == "triton.language.semantic"  # its broadcast
    try:
        plain = _runs()
    finally:
        assert P.install()
    assert (plain[-1] < 0).all()  # the int32 accumulator wrapped, with the overflow checks on and off
    for got, want in zip(patched, plain):
        assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_a_cached_shape_builds_the_types_and_tensors_triton_builds():
    if not P.install():
        pytest.skip("The patching applies only under the interpreter of the triton versions it was read for.")
    import triton.language as tl

    core = tl.core

    def built(make):
        values = []
        for shape in ([16, 32], core.tuple([16, 32]), [core.constexpr(16), 32], [8]):
            t = make(shape)
            values.append((t.name, list(t.shape), type(t.shape), t.numel, t.element_ty, t.shape.type.types))
            x = core.tensor(None, t)
            values.append((x.dtype, x.type, [s.value for s in x.shape], type(x.shape), x.numel.value))
        x = core.tensor(None, tl.float32)
        values.append((x.dtype, list(x.shape), x.numel.value))
        return values

    patched = built(lambda s: core.block_type(tl.float16, s)) + built(lambda s: core.block_type(tl.int32, s))
    first, again = core.block_type(tl.float32, [4, 4]), core.block_type(tl.float32, [4, 4])
    assert first.shape is not again.shape and first.shape.values is not again.shape.values  # fresh tuples
    P.uninstall()
    try:
        plain = built(lambda s: core.block_type(tl.float16, s)) + built(lambda s: core.block_type(tl.int32, s))
    finally:
        assert P.install()
    assert [repr(v) for v in patched] == [repr(v) for v in plain]
    with pytest.raises(ValueError, match="power of 2"):  # a shape never cached is validated as before
        core.block_type(tl.float32, [3, 4])
    core.block_type(tl.float32, [16, 32])
    with pytest.raises(AssertionError):  # a plain tuple is refused, as there, once its dims are cached too
        core.block_type(tl.float32, (16, 32))
