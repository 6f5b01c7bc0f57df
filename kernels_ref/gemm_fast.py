"""Fast reference GEMM for Hopper (sm_90): TMA descriptors, a persistent grid, grouped tile order.

This is the performance peer of the oracle's references, not one of its stages: it exists so that
the oracle can say how fast a correct GEMM runs on the same machine, in the same harness, as the
kernel under test and cuBLAS. `kernels_ref.gemm` stays the precise, stage-by-stage reference.

Data path: D = scale_a * scale_b * (A @ B^T), stored in out_dtype.
  descriptor  three host-side TMA descriptors (`triton.tools.tensor_descriptor.TensorDescriptor`):
              A [M, K] with box [BLOCK_M, BLOCK_K], B [N, K] with box [BLOCK_N, BLOCK_K], D [M, N]
              with box [BLOCK_M, BLOCK_N] (or half of it, see `epilogue_split`). Out-of-bounds reads
              are zero-filled, out-of-bounds writes dropped, so ragged edges need no masks.
  schedule    a persistent grid of min(#SMs, #tiles) programs; program p handles tiles p, p + P,
              p + 2P, ... in grouped order (GROUP_M tile rows share each B panel, so panels stay in
              L2). The tile loop is flattened with the k loop (`tl.range(..., flatten=True)`) so the
              software pipeline (`num_stages` TMA loads in flight) does not drain between tiles.
  mainloop    per k-block one `tl.dot(a, b.T, acc)`: wgmma with A and B from shared memory.
  epilogue    acc * (scale_a * scale_b) in fp32, one rounding to out_dtype (RNE), TMA store.
Warp specialization is not used: triton 3.6 documents `tl.range(warp_specialize=True)` as
Blackwell-only; a TMA-persistent bf16 GEMM without it was measured at 97-101 % of cuBLAS on the
H200 this project uses, so the pipelined loop is expected to suffice.

Layouts. A is [M, K] row-major. B is given as [N, K] row-major, i.e. K-major: the "TN" layout of
cuBLAS and the one `torch._scaled_mm` requires (its second operand is `b_nk.t()`, a column-major
[K, N]). It is the fast layout on Hopper: fp8 wgmma reads both operands K-major only, and TMA boxes
of B are then contiguous 128-byte rows. A [K, N] operand `b_kn` is passed as
`b_kn.t().contiguous()`. D is [M, N] row-major. Every row stride must be a multiple of 16 bytes
(K % 8 == 0 for bf16, K % 16 == 0 for e4m3, N % 8 == 0 for a bf16 output) and every base pointer
16-byte aligned: TMA rules, checked by `check_supported` and by `gemm_fast` with named errors.

Numerics.
  bf16     products exact, accumulated in fp32 by the tensor cores (wgmma, fp32 accumulator),
           block after block in k order; the scale is applied to the fp32 sum, then a single
           round-to-nearest-even to out_dtype. The same class of result as cuBLAS
           (`torch.matmul`), which also accumulates in fp32; the summation order differs, so the
           two agree to a few fp32 ulps of sum_k |a||b| before the final rounding.
  e4m3     `fp8_acc="fast"` (the default): triton's sm_90 default, `max_num_imprecise_acc=None`
           (which triton 3.6 turns into 2**30 on sm_90): the partial sums never leave the wgmma
           accumulator for the whole K. That accumulator is not a full fp32 adder for fp8
           inputs: Hopper keeps only about 14 significant bits of each partial sum (products are
           aligned and truncated; the DeepSeek-V3 report measured relative errors up to about 2 %
           at K = 4096), so the error grows with K. cuBLASLt's fast accumulation
           (CUBLASLT_MATMUL_DESC_FAST_ACCUM, selected by `torch._scaled_mm(...,
           use_fast_accum=True)`) is the same mode: it too never promotes partial sums to fp32,
           so the speed comparison with it is like for like.
           `fp8_acc="promoted"`: `max_num_imprecise_acc=BLOCK_K`: each k-block (BLOCK_K = 128:
           four wgmma k32 steps) is summed in a fresh wgmma accumulator and then added to the
           fp32 accumulator with an ordinary fp32 add on the CUDA cores (a promotion interval of
           BLOCK_K, as DeepGEMM does with 128). Error then stays near the bf16 output rounding;
           this matches cuBLASLt without fast accumulation in class, and costs some speed.
           Per-tensor scales (fp32, one element each, on the device, as `torch._scaled_mm` takes
           them) multiply the fp32 accumulator once in the epilogue: D = round(acc * (sa * sb)).
  Under the triton interpreter (CPU tests) the operand tiles are widened to fp32 before `tl.dot`
  (the interpreter multiplies raw bf16 bit patterns, triton issue 11584); products of bf16 and
  e4m3 values are exact in fp32, so only the summation differs from the GPU (the interpreter
  has no imprecise fp8 accumulator). The final cast rounds to nearest even on both: the GPU's
  cvt.rn, and under the interpreter (whose own fp32 -> bf16 conversion truncates) the codec's
  integer rounding (`_codec._encode`), which gives the same bits for every finite value and
  infinity; a NaN comes out as some NaN.

Error envelope (`error_bound`, shared by the tests and the benchmark): every element is within
r |D| + s S of the exact D, S = |sa sb| sum_k |a[m, k]| |b[n, k]|, with r the unit roundoff of
out_dtype (one RNE rounding) and s
  bf16               K * 2^-23: worst-case recursive fp32 summation, allowing a truncating adder;
  e4m3 promoted      2^-11 + K * 2^-23: four truncating k32 steps (2^-13 each) per k-block, then
                     fp32 adds;
  e4m3 fast          2^-9: an empirical envelope, not a proof. The worst case, K/32 truncations
                     of 2^-13 S each, is S/32 at K = 8192, larger than a typical |D|; the GPU test
                     holds cuBLASLt's fast accumulation to the same envelope, so a too-tight
                     envelope shows up as a cuBLASLt failure, not as a Triton one.
These are loose on purpose (a speed peer, not the oracle's stage-exact references).

Constraints: a and b both bf16 or both float8_e4m3fn, on one device; out_dtype bf16, fp16 or fp32;
M, N, K >= 1; the TMA alignment rules above; a config whose shared memory fits (see `GemmConfig`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref._codec import _encode, _to_storage
from kernels_ref._common import interpreting

try:  # host-side TMA descriptors: triton >= 3.4 (3.6 on the H200, 3.9 in CI)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None

IN_DTYPES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}
OUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_OUT_FMT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # the codec's format codes
FP8_ACCS = ("fast", "promoted")

# Shared memory a block may use on sm_90 (227 KiB), less a margin for barriers and scratch.
SMEM_LIMIT = 227 * 1024 - 2 * 1024
_POW2_BLOCKS = (16, 32, 64, 128, 256)


class GemmFastError(ValueError):
    """An operand, option or config that the fast GEMM cannot run; the message names it."""


@dataclass(frozen=True)
class GemmConfig:
    """One launch configuration: tile shape, grouped order, pipeline depth, warps, epilogue form.

    epilogue_split stores each output tile as two [BLOCK_M, BLOCK_N / 2] halves, which halves
    the epilogue's shared-memory buffer (leaving room for one more pipeline stage). flatten merges
    the tile loop with the k loop so that the pipeline runs across tile boundaries."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_stages: int = 3
    num_warps: int = 8
    epilogue_split: bool = False
    flatten: bool = True

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or v not in _POW2_BLOCKS:
                raise GemmFastError(f"GemmConfig.{name}={v!r} is not allowed; allowed: "
                                    f"{', '.join(map(str, _POW2_BLOCKS))}")
        if isinstance(self.group_m, bool) or not isinstance(self.group_m, int) or not 1 <= self.group_m <= 64:
            raise GemmFastError(f"GemmConfig.group_m={self.group_m!r} is not allowed; allowed: 1..64")
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise GemmFastError(f"GemmConfig.num_stages={self.num_stages!r} is not allowed; allowed: 1..8")
        if self.num_warps not in (4, 8) or isinstance(self.num_warps, bool):
            raise GemmFastError(f"GemmConfig.num_warps={self.num_warps!r} is not allowed; allowed: 4, 8")
        for name in ("epilogue_split", "flatten"):
            if not isinstance(getattr(self, name), bool):
                raise GemmFastError(f"GemmConfig.{name}={getattr(self, name)!r} must be a bool")

    def smem_bytes(self, in_itemsize: int, out_itemsize: int) -> int:
        """Shared memory of the operand ring (num_stages A and B boxes) plus the epilogue buffer."""
        ring = self.num_stages * (self.block_m + self.block_n) * self.block_k * in_itemsize
        store_n = self.block_n // 2 if self.epilogue_split else self.block_n
        return ring + self.block_m * store_n * out_itemsize

    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} s{self.num_stages} "
                f"w{self.num_warps}{' split' if self.epilogue_split else ''}{'' if self.flatten else ' noflat'}")

    def as_dict(self) -> dict:
        return asdict(self)


# Candidates an autotune tries on the GPU (benchmarks/gemm_bench.py); short on purpose. They are
# shapes wgmma likes (128-row tiles for two consumer warpgroups, 128-byte K rows for 128-byte
# swizzle), not measured winners: the defaults below are the first entry of each list.
def _candidates(block_k: int) -> tuple[GemmConfig, ...]:
    """The candidate shapes with K rows of block_k elements (128 bytes of the operand type)."""
    return (
        GemmConfig(128, 256, block_k, 8, 3, 8, False, True),
        GemmConfig(128, 256, block_k, 8, 4, 8, True, True),
        GemmConfig(128, 128, block_k, 8, 4, 8, False, True),
        GemmConfig(256, 128, block_k, 8, 3, 8, False, True),
        GemmConfig(128, 256, block_k, 8, 3, 8, False, False),
    )


CANDIDATES: dict[str, tuple[GemmConfig, ...]] = {"bf16": _candidates(64), "e4m3": _candidates(128)}
DEFAULTS: dict[str, GemmConfig] = {k: v[0] for k, v in CANDIDATES.items()}


@triton.jit
def _tile_coords(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M consecutive tile rows sweep the tile columns together."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tm = first_m + (tile % per_group) % rows
    tn = (tile % per_group) // rows
    return tm, tn


@triton.jit
def _gemm_fast_kernel(a_desc, b_desc, d_desc, scale_a_ptr, scale_b_ptr, M, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr,
                      FLATTEN: tl.constexpr, HAS_SCALE_A: tl.constexpr, HAS_SCALE_B: tl.constexpr,
                      IMPRECISE_ACC: tl.constexpr, UPCAST: tl.constexpr, OUT_FMT: tl.constexpr,
                      OUT_W: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    n_tiles = tiles_m * tiles_n
    k_blocks = tl.cdiv(K, BLOCK_K)
    out_ty = d_desc.dtype
    scale = 1.0
    if HAS_SCALE_A:
        scale = scale * tl.load(scale_a_ptr)
    if HAS_SCALE_B:
        scale = scale * tl.load(scale_b_ptr)
    # The epilogue keeps its own tile counter: a value used both before the k loop and after it
    # hampers the pipeliner of a flattened loop.
    tile_out = pid - PROGRAMS
    for tile in tl.range(pid, n_tiles, PROGRAMS, flatten=FLATTEN):
        tm, tn = _tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        m0 = tm * BLOCK_M
        n0 = tn * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_blocks):
            k0 = kb * BLOCK_K
            a = a_desc.load([m0, k0])
            b = b_desc.load([n0, k0])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=IMPRECISE_ACC)
        tile_out += PROGRAMS
        om, on = _tile_coords(tile_out, tiles_m, tiles_n, GROUP_M)
        if HAS_SCALE_A or HAS_SCALE_B:
            acc = acc * scale
        if UPCAST:  # the interpreter: round to nearest even explicitly (its own conversion truncates)
            acc = _to_storage(_encode(acc, OUT_FMT, False), OUT_W).to(out_ty, bitcast=True)
        if EPILOGUE_SPLIT:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            lo, hi = tl.split(halves)
            d_desc.store([om * BLOCK_M, on * BLOCK_N], lo.to(out_ty))
            d_desc.store([om * BLOCK_M, on * BLOCK_N + BLOCK_N // 2], hi.to(out_ty))
        else:
            d_desc.store([om * BLOCK_M, on * BLOCK_N], acc.to(out_ty))


def _itemsize(dt: torch.dtype) -> int:
    return torch.empty((), dtype=dt).element_size()


def check_supported(a_dtype: torch.dtype, b_dtype: torch.dtype, m: int, n: int, k: int,
                    out_dtype: torch.dtype = torch.bfloat16, config: Optional[GemmConfig] = None,
                    fp8_acc: str = "fast") -> list[str]:
    """Reasons the fast GEMM cannot run this problem (empty list: it can)."""
    reasons = []
    if TensorDescriptor is None:
        reasons.append(f"triton {triton.__version__} has no triton.tools.tensor_descriptor (needs triton >= 3.4)")
    if a_dtype not in IN_DTYPES:
        reasons.append(f"a has dtype {a_dtype}; allowed: {', '.join(map(str, IN_DTYPES))}")
    if b_dtype != a_dtype:
        reasons.append(f"b has dtype {b_dtype} but a has {a_dtype}; both must be bf16 or both float8_e4m3fn")
    if out_dtype not in OUT_DTYPES:
        reasons.append(f"out_dtype={out_dtype} is not allowed; allowed: {', '.join(map(str, OUT_DTYPES))}")
    if fp8_acc not in FP8_ACCS:
        reasons.append(f"fp8_acc={fp8_acc!r} is not allowed; allowed: {', '.join(FP8_ACCS)}")
    elif fp8_acc == "promoted" and a_dtype != torch.float8_e4m3fn:
        reasons.append("fp8_acc='promoted' applies to float8_e4m3fn operands only")
    for name, v in (("M", m), ("N", n), ("K", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            reasons.append(f"{name}={v!r} must be a positive integer")
    if reasons:
        return reasons
    in_size, out_size = _itemsize(a_dtype), _itemsize(out_dtype)
    if (k * in_size) % 16:
        reasons.append(f"K={k}: a row of A and of B is {k * in_size} bytes; TMA needs a multiple of 16 "
                       f"(K a multiple of {16 // in_size})")
    if (n * out_size) % 16:
        reasons.append(f"N={n}: a row of D is {n * out_size} bytes; TMA needs a multiple of 16 "
                       f"(N a multiple of {16 // out_size} for {OUT_DTYPES[out_dtype]})")
    if config is not None:
        smem = config.smem_bytes(in_size, out_size)
        if smem > SMEM_LIMIT:
            reasons.append(f"config {config.label()} needs {smem} bytes of shared memory; at most {SMEM_LIMIT}")
        if config.block_k * in_size < 32:
            reasons.append(f"config block_k={config.block_k} is {config.block_k * in_size} bytes of K; "
                           "wgmma needs at least 32")
    return reasons


def _check_operand(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise GemmFastError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise GemmFastError(f"{name} must be 2-D, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    if cols > 1 and x.stride(1) != 1:
        raise GemmFastError(f"{name} must be row-major (stride(1) == 1), got strides {x.stride()}")
    if rows > 1 and (x.stride(0) * x.element_size()) % 16:
        raise GemmFastError(f"{name} has a row stride of {x.stride(0) * x.element_size()} bytes; "
                            "TMA needs a multiple of 16")
    if x.data_ptr() % 16:
        raise GemmFastError(f"{name} starts at an address that is not 16-byte aligned; TMA needs 16")


def _check_scale(name: str, s, dev: torch.device) -> None:
    if s is None:
        return
    if not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32:
        raise GemmFastError(f"{name} must be a one-element float32 tensor (a per-tensor scale), got "
                            f"{type(s).__name__ if not isinstance(s, torch.Tensor) else (s.dtype, tuple(s.shape))}")
    if s.device != dev:
        raise GemmFastError(f"{name} is on {s.device} but a is on {dev}; all tensors must share a device")


def _descriptor(x: torch.Tensor, box: list[int]):
    """TMA descriptor of a row-major 2-D tensor (a one-row tensor's stride is irrelevant to TMA)."""
    rows, cols = x.shape
    return TensorDescriptor(x, [rows, cols], [x.stride(0) if rows > 1 else cols, 1], box)


_SM_COUNT: dict = {}


def default_programs(device: torch.device) -> int:
    """Persistent programs per launch: one per SM on a GPU; 3 under the interpreter (so that a
    program handles several tiles there too)."""
    if device.type != "cuda":
        return 3
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def gemm_fast(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
              scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
              config: Optional[GemmConfig] = None, fp8_acc: str = "fast",
              programs: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """D [M, N] = scale_a * scale_b * (a @ b.T) in out_dtype; a [M, K], b [N, K], both row-major
    (module docstring: layouts and numerics). config None takes DEFAULTS for the dtype; programs
    None one per SM; out, if given, a row-major [M, N] tensor of out_dtype to write into."""
    _check_operand("a", a)
    _check_operand("b", b)
    M, K = a.shape
    N, Kb = b.shape
    if Kb != K:
        raise GemmFastError(f"b is [N, K] = {tuple(b.shape)} but a is [M, K] = {tuple(a.shape)}: K differs "
                            "(b must be given as [N, K], K-major; pass b_kn.t().contiguous() for a [K, N] b)")
    if a.device != b.device:
        raise GemmFastError(f"b is on {b.device} but a is on {a.device}; all tensors must share a device")
    if config is None:  # the dtype's default, or the first candidate whose tiles fit this output type
        name = IN_DTYPES.get(a.dtype, "bf16")
        fitting = [c for c in CANDIDATES.get(name, ())
                   if not check_supported(a.dtype, b.dtype, M, N, K, out_dtype, c, fp8_acc)]
        config = fitting[0] if fitting else DEFAULTS.get(name)
    if not isinstance(config, GemmConfig):
        raise GemmFastError(f"config must be a GemmConfig, got {type(config).__name__}")
    reasons = check_supported(a.dtype, b.dtype, M, N, K, out_dtype, config, fp8_acc)
    if reasons:
        raise GemmFastError("; ".join(reasons))
    dev = a.device
    if dev.type == "cpu" and not interpreting():
        raise GemmFastError("a is on the CPU, which Triton can run only under its interpreter: set "
                            "TRITON_INTERPRET=1 before triton is imported, or pass CUDA tensors")
    _check_scale("scale_a", scale_a, dev)
    _check_scale("scale_b", scale_b, dev)
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=dev)
    else:
        if not isinstance(out, torch.Tensor) or out.shape != (M, N) or out.dtype != out_dtype or out.device != dev:
            raise GemmFastError(f"out must be a [{M}, {N}] {out_dtype} tensor on {dev}")
        _check_operand("out", out)
    if programs is None:
        programs = default_programs(dev)
    if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
        raise GemmFastError(f"programs={programs!r} must be a positive integer")

    cfg = config
    store_n = cfg.block_n // 2 if cfg.epilogue_split else cfg.block_n
    a_desc = _descriptor(a, [cfg.block_m, cfg.block_k])
    b_desc = _descriptor(b, [cfg.block_n, cfg.block_k])
    d_desc = _descriptor(out, [cfg.block_m, store_n])
    n_tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    grid = min(programs, n_tiles)
    interp = interpreting()
    imprecise = cfg.block_k if (fp8_acc == "promoted" and not interp) else None
    opts = {} if interp else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    _gemm_fast_kernel[(grid,)](
        a_desc, b_desc, d_desc,
        scale_a if scale_a is not None else out, scale_b if scale_b is not None else out,
        M, N, K,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, PROGRAMS=grid,
        EPILOGUE_SPLIT=cfg.epilogue_split, FLATTEN=cfg.flatten,
        HAS_SCALE_A=scale_a is not None, HAS_SCALE_B=scale_b is not None,
        IMPRECISE_ACC=imprecise, UPCAST=interp, OUT_FMT=_OUT_FMT[out.dtype], OUT_W=out.element_size(), **opts)
    return out


def error_bound(a_dtype: torch.dtype, k: int, out_dtype: torch.dtype = torch.bfloat16,
                fp8_acc: str = "fast") -> tuple[float, float]:
    """(r, s) of the error envelope |D - exact| <= r |exact| + s S (module docstring)."""
    u_out = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
    if out_dtype not in u_out:
        raise GemmFastError(f"out_dtype={out_dtype} is not allowed; allowed: {', '.join(map(str, u_out))}")
    if a_dtype == torch.bfloat16:
        s = k * 2.0 ** -23
    elif a_dtype == torch.float8_e4m3fn and fp8_acc == "promoted":
        s = 2.0 ** -11 + k * 2.0 ** -23
    elif a_dtype == torch.float8_e4m3fn and fp8_acc == "fast":
        s = 2.0 ** -9
    else:
        raise GemmFastError(f"no error envelope for a_dtype={a_dtype}, fp8_acc={fp8_acc!r}")
    return u_out[out_dtype], s


@dataclass(frozen=True)
class ErrorReport:
    """How far a GEMM result D is from the exact product, against the envelope r |D| + s S.
    worst is the largest err/bound (<= 1 passes), at element `where` (received, expected);
    normwise is ||D - exact||_F / ||exact||_F."""

    worst: float
    where: tuple
    received: float
    expected: float
    normwise: float
    max_abs_expected: float
    r: float
    s: float

    @property
    def ok(self) -> bool:
        return self.worst <= 1.0 and self.max_abs_expected > 0

    def describe(self) -> str:
        return (f"worst err/bound {self.worst:.3g} at {self.where} (received {self.received:.6g}, expected "
                f"{self.expected:.6g}); normwise {self.normwise:.3g}; envelope {self.r:.3g}|D| + {self.s:.3g}S")


def error_report(d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, scale_a: Optional[torch.Tensor] = None,
                 scale_b: Optional[torch.Tensor] = None, fp8_acc: str = "fast") -> ErrorReport:
    """Compare D (from gemm_fast, cuBLAS or cuBLASLt: same layouts) with the float64 product
    computed on D's device, under `error_bound`. A result that is all zero never passes."""
    r, s_coef = error_bound(a.dtype, a.shape[1], d.dtype, fp8_acc)
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    sc = 1.0
    for x in (scale_a, scale_b):
        if x is not None:
            sc *= float(x.reshape(()).item())
    exact = (a64 @ b64.t()) * sc
    big_s = (a64.abs() @ b64.abs().t()) * abs(sc)
    del a64, b64
    err = (d.to(torch.float64) - exact).abs()
    ratio = err / (r * exact.abs() + s_coef * big_s).clamp_min(torch.finfo(torch.float64).tiny)
    ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, float("inf")), ratio)
    flat = int(torch.argmax(ratio).item())
    i, j = divmod(flat, d.shape[1])
    norm = float(torch.linalg.vector_norm(exact).item())
    return ErrorReport(worst=float(ratio.reshape(-1)[flat].item()), where=(i, j), received=float(d[i, j].item()),
                       expected=float(exact[i, j].item()),
                       normwise=float(torch.linalg.vector_norm(err).item()) / norm if norm > 0 else float("inf"),
                       max_abs_expected=float(exact.abs().max().item()), r=r, s=s_coef)


def gemm_fast_host(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                   scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Float64 specification on the CPU: round(sa * sb * sum_k a[m, k] b[n, k]) to out_dtype."""
    x = a.detach().cpu().double() @ b.detach().cpu().double().t()
    s = 1.0
    if scale_a is not None:
        s *= float(scale_a.detach().cpu().double().reshape(()))
    if scale_b is not None:
        s *= float(scale_b.detach().cpu().double().reshape(()))
    return (x * s).to(out_dtype)
