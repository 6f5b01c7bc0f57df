"""The CPU tier's memo of interpreter launches (tests/launch_memo.py) serves a launch again only when
all it reads is the same: the same bytes in every tensor it is handed (an output's too), the same
aliasing, the same other arguments and the same code; what it serves is the bytes the launch wrote."""

import pytest
import torch
import triton
import triton.language as tl

import launch_memo  # tests/ is on sys.path

SCALE = 3


@triton.jit
def _scaled(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * SCALE, mask=offs < n)


@triton.jit
def _write_then_read(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.full((BLOCK,), 1.0, tl.float32))
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) + 1)


@triton.jit
def _failing(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)
    tl.static_assert(BLOCK < 0, "always fails")


@pytest.fixture
def memo():
    if not launch_memo.install():
        pytest.skip("The memo serves Triton's interpreter, which this machine does not use (a GPU is visible).")
    launch_memo.uninstall()  # nothing kept from the tests before
    assert launch_memo.install()
    yield launch_memo.stats


def _launch(x, y, n=None):
    _scaled[(1,)](x, y, x.numel() if n is None else n, BLOCK=16)
    return y


def _counts(stats):
    return stats["hits"], stats["misses"]


def test_a_repeated_launch_is_served_with_the_bytes_it_wrote(memo):
    x = torch.arange(16, dtype=torch.float32)
    first = _launch(x, torch.zeros(16)).clone()
    hits = memo["hits"]
    again = _launch(x.clone(), torch.zeros(16))  # other tensors, the same bytes
    assert memo["hits"] == hits + 1
    assert torch.equal(first, x * 3) and torch.equal(again, first)


def test_a_changed_input_byte_is_launched(memo):
    x = torch.arange(16, dtype=torch.float32)
    _launch(x, torch.zeros(16))
    hits = memo["hits"]
    x[7] = -1.0
    got = _launch(x, torch.zeros(16))
    assert memo["hits"] == hits and got[7] == -3.0


def test_an_output_s_bytes_before_the_launch_are_part_of_the_key(memo):
    x = torch.arange(16, dtype=torch.float32)
    zeros = _launch(x, torch.zeros(16), n=8).clone()  # writes half of y: the rest is what y held
    nans = _launch(x, torch.full((16,), float("nan")), n=8)
    assert torch.equal(zeros[:8], nans[:8]) and (zeros[8:] == 0).all() and nans[8:].isnan().all()


def test_aliasing_is_part_of_the_key(memo):
    v = torch.arange(24, dtype=torch.float32)
    apart = (v[0:16].clone(), v[8:24].clone())  # the same bytes as the overlapping views below
    _write_then_read[(1,)](*apart, BLOCK=16)
    assert torch.equal(apart[1], torch.arange(16, dtype=torch.float32) + 1)
    _write_then_read[(1,)](v[0:16], v[8:24], BLOCK=16)  # y overlaps x: x's last 8 read the 1s written
    want = torch.cat([torch.arange(8, dtype=torch.float32), torch.arange(1, 9, dtype=torch.float32),
                      torch.full((8,), 2.0)])
    assert torch.equal(v, want)


def test_a_view_is_keyed_by_its_own_bytes_and_its_offset_from_its_neighbours(memo):
    big = torch.arange(64, dtype=torch.float32)
    out = torch.zeros(64)
    _launch(big[16:32], out[16:32])
    other = torch.arange(64, dtype=torch.float32) + 100
    other[16:32] = big[16:32]  # the same bytes in the view, others around it
    hits = memo["hits"]
    got = torch.zeros(64)
    _launch(other[16:32], got[16:32])
    assert memo["hits"] == hits + 1 and torch.equal(got, out)
    assert (got[:16] == 0).all() and (got[32:] == 0).all()  # nothing written outside the view


def test_a_changed_global_of_the_kernel_is_launched(memo, monkeypatch):
    x = torch.arange(16, dtype=torch.float32)
    _launch(x, torch.zeros(16))
    monkeypatch.setitem(_scaled.fn.__globals__, "SCALE", 5)
    assert torch.equal(_launch(x, torch.zeros(16)), x * 5)


def test_a_launch_that_raises_is_not_kept(memo):
    kept = len(launch_memo._memo)
    for _ in range(2):
        with pytest.raises(Exception, match="always fails"):
            _failing[(1,)](torch.zeros(16, dtype=torch.int32), BLOCK=16)
    assert len(launch_memo._memo) == kept


def test_paused_launches_run_in_the_interpreter(memo):
    x = torch.arange(16, dtype=torch.float32)
    _launch(x, torch.zeros(16))
    before = _counts(memo)
    with launch_memo.paused():
        got = _launch(x, torch.zeros(16))
    assert _counts(memo) == before and torch.equal(got, x * 3)


def test_a_launch_whose_key_cannot_be_made_runs(memo):
    def grid(meta):  # the interpreter hands a grid its own values, not the torch tensors the key reads
        if isinstance(meta["x_ptr"], torch.Tensor):
            raise ZeroDivisionError("a grid written for the interpreter's arguments")
        return (1,)

    x = torch.arange(16, dtype=torch.float32)
    unkept = memo["unkept"]
    for _ in range(2):
        y = torch.zeros(16)
        _scaled[grid](x, y, 16, BLOCK=16)
        assert torch.equal(y, x * 3)
    assert memo["unkept"] == unkept + 2
