"""Operands of a problem and the controlled input ladder.

Inputs are designed so that a bug points at itself:
- ones: A = B = 1 (and scales, C, bias = 1): every accumulator element equals K, so the output
  has one analytic value;
- index: each operand value encodes where it came from, (row mod P, col mod Q), exactly in the
  dtype, so a misplaced element names its source;
- ktag: A = 1 and every row of B in k-block j holds 2^(j mod T): the accumulator, divided by BK,
  is a binary record of which k-blocks were summed;
- scales: a block-scaled problem's A = B = 1 and every scale block a distinct power of two (A's
  2^-(1 + (i + 7g) mod P), B's 2^((j + 7g + 3 + 9e) mod P) for scale block row i / column j, k group
  g and the group e of a grouped or batched problem's B (0 otherwise); P = 23, or 8 for e4m3 scales):
  a misapplied scale is exact and names itself (kernels_ref.scales, oracle.judging.scale_hint);
- random[:seed]: seeded normal values (the default seed is 0);
- dump:PATH: tensors from a dump file (captured, so not controlled).

A K-grouped problem (oracle.problem.spec: k_groups) draws A [M, K] and B [K, N] whole, and each
group's slice is a controlled problem by itself: under ones its accumulator is K_g (an empty group's
0), index encodes each group's columns of A and rows of B from the group's first k, ktag counts the
k-blocks from it, and the scales ladder's k group g is the problem's global one (so a scale column
of another group is another power of two). A kernel that reads another group's K slice shows under
random inputs always, under ones where the two groups' K differ.

A quantised B (oracle.problem.spec: b_scales given) is stored as the problem says: B holds the
stored values (a packed 4-bit B: uint8 [K / 2, N], two k per byte in b_packing's order, or for
k8_interleaved four bytes a word of 8 k; int8 / e4m3 / e5m2: [K, N] in that dtype), b_scales
[K / group, N] in the scales' dtype (e8m0: raw bytes), b_zeros the same shape (int: int8 for int4 /
int8, uint8 for uint4; float and float_offset: the scales' dtype). Its ladder: ones: q = 1
(float_offset: q = c + 1), z = 0, s = 1 (every w = 1); index: q encodes (k mod 8, n mod 4), s and z encode
(group, column), so a wrong nibble, group or zero point changes the value; random: q over the
type's range, s in [1/16, 3/16), z over the integer range (or [0, 8) float; a float offset in
[-1/2, 1/2)). ktag is not defined
for a quantised B (its tags live in B's values).

A quantised A (a_scales given) is the same with M in N's place and K along A's rows: A holds [M, K]
stored values (packed: uint8 [M, K / 2], two k a byte along K), a_scales and a_zeros [M, K / group];
its ladder is B's transposed (q encodes (k mod 8, m mod 4)), beside a B drawn as A is beside a
quantised B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from harness.errors import BadInput
from kernels_ref.dtypes import ALL_TYPES, DTYPES
from oracle.problem.spec import ProblemSpec

LADDER = ("ones", "index", "ktag", "scales", "random")
# attention's controlled ladders (oracle.run.attention_inputs documents each)
ATTENTION_LADDER = ("ones", "one_hot", "index", "large_logits", "masked_row", "random")
KTAG_PERIOD = 16


class InputError(BadInput, ValueError):
    """Operands that do not fit the problem."""


@dataclass(frozen=True)
class Operands:
    """Logical operands: A [M, K], B [K, N] (a quantised B: its stored values, see the module
    docstring), C [M, N]; bias [M] or [N]; scales by kind (tensor [1], row [M], col [N], block
    [ceil(rows/g), ceil(K/gk)]; a grouped or batched problem's B block scales [groups, ceil(N/g),
    ceil(K/gk)]); a quantised B's group scales and zero points [K / group, N], a quantised A's
    [M, K / group]."""

    a: torch.Tensor
    b: torch.Tensor
    c: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None
    scale_a: Optional[torch.Tensor] = None
    scale_b: Optional[torch.Tensor] = None
    b_scales: Optional[torch.Tensor] = None
    b_zeros: Optional[torch.Tensor] = None
    a_scales: Optional[torch.Tensor] = None
    a_zeros: Optional[torch.Tensor] = None

    def named(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in (("a", self.a), ("b", self.b), ("c", self.c), ("bias", self.bias),
                                  ("scale_a", self.scale_a), ("scale_b", self.scale_b),
                                  ("b_scales", self.b_scales), ("b_zeros", self.b_zeros),
                                  ("a_scales", self.a_scales), ("a_zeros", self.a_zeros)) if v is not None}

    def quant_kn(self, op: str):
        """Quantised operand `op`'s stored values, scales and zero points with K along the rows, as
        kernels_ref.dequant reads them: B's as they are, A's transposed ([K / per, M], [G, M]; views)."""
        t = (lambda x: None if x is None else x.t()) if op == "a" else (lambda x: x)
        return t(getattr(self, op)), t(getattr(self, f"{op}_scales")), t(getattr(self, f"{op}_zeros"))

    def to(self, device) -> "Operands":
        return Operands(**{k: v.to(device) for k, v in self.named().items()})


@dataclass(frozen=True)
class Provenance:
    """Where the inputs came from. Only controlled inputs can give a VERDICT."""

    ladder: str  # ones | index | ktag | random | dump | captured (attention: ATTENTION_LADDER)
    seed: Optional[int] = None
    source: Optional[str] = None  # a file, for dumps
    generator: str = "cpu"  # random: the device whose generator drew the values ("cpu" or "cuda")

    @property
    def controlled(self) -> bool:
        return self.ladder in LADDER or self.ladder in ATTENTION_LADDER

    def describe(self) -> str:
        if self.ladder == "random":
            return f"random (seed {self.seed})" if self.generator == "cpu" else \
                f"random (seed {self.seed}, drawn on {self.generator})"
        if self.source:
            return f"{self.ladder} ({self.source})"
        return self.ladder


def parse_inputs(text: str, ladders: tuple[str, ...] = LADDER) -> tuple[str, Optional[int], Optional[str]]:
    """An inputs choice, `LADDER[:SEED]` or `dump:PATH`, as (ladder, seed, path); InputError
    naming what is wrong. `ladders`: the problem kind's (ATTENTION_LADDER for attention)."""
    if not isinstance(text, str):
        raise InputError(f"inputs {text!r} must be a string: ones, index, ktag, scales, random[:seed] or dump:PATH")
    ladder, _, arg = text.partition(":")
    if ladder == "dump":
        if not arg:
            raise InputError("inputs dump:PATH needs a path")
        return ladder, None, arg
    if ladder not in ladders:
        raise InputError(f"inputs {text!r}: {ladder!r} is not an input ladder; choose one of {', '.join(ladders)} "
                         f"(random takes a seed: random:7) or dump:PATH")
    if arg and ladder != "random":
        raise InputError(f"inputs {text!r}: only random takes a seed")
    if arg and not (arg.isdigit() and int(arg) < 2**63):
        raise InputError(f"inputs {text!r}: the seed must be a non-negative integer below 2^63")
    return ladder, int(arg) if arg else 0, None


def expected_shapes(spec: ProblemSpec) -> dict[str, Optional[tuple[int, ...]]]:
    """Logical shapes. A grouped or batched problem: A [total M, K], B [groups, K, N], C [total M, N],
    a column bias per group [groups, N], A's block scales [total M, K / gk] (per row, stacked with A)
    and B's one per group [groups, N / gn, K / gk]. A K-grouped problem: A [M, K] and B [K, N] and
    their block scales as a plain problem's, C [G * M, N] and a column bias per group [G, N]."""
    m, n, k = spec.total_m, spec.n, spec.k
    groups = spec.group_sizes
    per_group_b = groups is not None and spec.k_groups is None  # one B per group (not a K-grouped problem's)
    shapes: dict[str, Optional[tuple[int, ...]]] = {"a": (spec.a_rows, k), "b": (len(groups), k, n) if per_group_b else (k, n),
                                                    "c": None, "bias": None, "scale_a": None, "scale_b": None,
                                                    "b_scales": None, "b_zeros": None, "a_scales": None,
                                                    "a_zeros": None}
    op = spec.quant_op
    if op is not None:  # stored along K; scales and zero points per group along K of each row of A / column of B
        kq = k // ALL_TYPES[getattr(spec, f"{op}_dtype")].per_item
        shapes[op] = (kq, n) if op == "b" else (m, kq)
        shapes[f"{op}_scales"] = (spec.quant_groups, n) if op == "b" else (m, spec.quant_groups)
        if getattr(spec, f"{op}_zeros") != "none":
            shapes[f"{op}_zeros"] = shapes[f"{op}_scales"]
    if spec.beta != 0:
        shapes["c"] = (m, n)
    if spec.bias != "none":
        shapes["bias"] = (m,) if spec.bias == "row" else (n,) if groups is None else (len(groups), n)
    for op, rows in (("a", spec.a_rows), ("b", n)):
        s = getattr(spec, f"scale_{op}")
        if s.kind == "tensor":
            shapes[f"scale_{op}"] = (1,)
        elif s.kind in ("row", "col"):
            shapes[f"scale_{op}"] = (rows,)
        elif s.kind == "block":
            shapes[f"scale_{op}"] = (-(-rows // s.block[0]), -(-k // s.block[1]))
            if op == "b" and per_group_b:  # one B per group, one scale tensor per B
                shapes["scale_b"] = (len(groups),) + shapes["scale_b"]
    return shapes


def group_scales(spec: ProblemSpec, ops: Operands, g: int):
    """(scale_a, scale_b) of group g of a grouped or batched problem: per-tensor scales as they are;
    block scales A's rows of the group ([M_g, K / gk], stacked with A) and B's tensor of the group
    ([N / gn, K / gk]). A K-grouped problem's: both tensors' k-group columns of the group
    ([..., K_g / gk]: every K_g is a multiple of gk)."""
    if spec.k_groups is not None:
        if not spec.block_scaled:
            return ops.scale_a, ops.scale_b
        gk = spec.scale_a.block[1]
        c0, c1 = spec.k_offsets[g] // gk, spec.k_offsets[g + 1] // gk
        return ops.scale_a[:, c0:c1], ops.scale_b[:, c0:c1]
    sizes = spec.group_sizes
    o, m_g = sum(sizes[:g]), sizes[g]
    sa = ops.scale_a[o:o + m_g] if spec.scale_a.kind == "block" else ops.scale_a
    sb = ops.scale_b[g] if spec.scale_b.kind == "block" else ops.scale_b
    return sa, sb


def check_operands(spec: ProblemSpec, ops: Operands) -> None:
    """Raise InputError naming the tensor, its shape or dtype, and what the problem needs."""
    shapes = expected_shapes(spec)
    dtypes = {"a": ALL_TYPES[spec.a_dtype].torch, "b": ALL_TYPES[spec.b_dtype].torch}
    op = spec.quant_op
    if op is not None:
        dtypes[f"{op}_scales"] = ALL_TYPES[getattr(spec, f"{op}_scales")].torch
        if getattr(spec, f"{op}_zeros") != "none":
            dtypes[f"{op}_zeros"] = spec.dequant_config.zero_torch()
    if spec.c_dtype:
        dtypes["c"] = DTYPES[spec.c_dtype].torch
    dtypes["bias"] = DTYPES[spec.bias_dtype].torch
    given = ops.named()
    for name, shape in shapes.items():
        t = given.get(name)
        if shape is None:
            if t is not None:
                raise InputError(f"operand {name!r} was given but the problem does not use it")
            continue
        if t is None:
            raise InputError(f"operand {name!r} is missing: the problem needs shape {list(shape)}")
        if tuple(t.shape) != shape:
            raise InputError(f"operand {name!r} has shape {list(t.shape)}, the problem needs {list(shape)}")
        want = dtypes.get(name, _block_scale_dtype(spec, name))
        if t.dtype != want:
            raise InputError(f"operand {name!r} has dtype {t.dtype}, the problem needs {want}")


def _block_scale_dtype(spec: ProblemSpec, name: str) -> torch.dtype:
    """The torch dtype of an operand the dtype table leaves to fp32: a block scale in its stored dtype."""
    if name in ("scale_a", "scale_b") and getattr(spec, name).kind == "block":
        from kernels_ref.scales import torch_dtype

        return torch_dtype(getattr(spec, name).dtype)
    return torch.float32


def pow2_scales(spec: ProblemSpec, name: str) -> torch.Tensor:
    """The `scales` ladder's values of block scale `name` (float32): a distinct power of two per block
    (module docstring); a grouped problem's B scales also step by 9 per group e, so B[e]'s scale
    differs from B[e']'s at the same place and names its group."""
    s = getattr(spec, name)
    shape = expected_shapes(spec)[name]
    rows, groups = shape[-2:]
    period = 8 if s.dtype == "e4m3" else 23
    i = torch.arange(rows)[:, None]
    g = torch.arange(groups)[None, :]
    if name == "scale_a":
        return torch.pow(2.0, -(1 + (i + 7 * g) % period).double()).float()
    e = torch.arange(shape[0])[:, None, None] if len(shape) == 3 else 0
    return torch.pow(2.0, ((i + 7 * g + 3 + 9 * e) % period).double()).float()


def _store_block_scales(spec: ProblemSpec, ops: "Operands") -> "Operands":
    """Block scales drawn as fp32 values, held in their stored dtype (e8m0: the nearest power of two's
    byte; e4m3: rounded to it)."""
    import dataclasses

    from kernels_ref.scales import stored

    out = {}
    for name in ("scale_a", "scale_b"):
        s, t = getattr(spec, name), getattr(ops, name)
        if s.kind != "block" or s.dtype == "fp32" or t is None:
            continue
        v = t.double()
        if s.dtype == "e8m0":
            v = torch.pow(2.0, torch.log2(v).round().clamp(-127, 127))
        else:
            v = v.to(torch.float8_e4m3fn).double()
        out[name] = stored(v, s.dtype)
    return dataclasses.replace(ops, **out) if out else ops


def operand_bytes(spec: ProblemSpec) -> int:
    """Bytes of the problem's operands and output in their dtypes (scales in fp32)."""
    total = spec.total_m * spec.n * DTYPES[spec.out_dtype].itemsize
    sizes = {"a": ALL_TYPES[spec.a_dtype].itemsize, "b": ALL_TYPES[spec.b_dtype].itemsize,
             "c": DTYPES[spec.c_dtype].itemsize if spec.c_dtype else 4, "bias": DTYPES[spec.bias_dtype].itemsize}
    op = spec.quant_op
    if op is not None:
        sizes[f"{op}_scales"] = sizes[f"{op}_zeros"] = ALL_TYPES[getattr(spec, f"{op}_scales")].itemsize
    for name, shape in expected_shapes(spec).items():
        if shape is not None:
            total += math.prod(shape) * sizes.get(name, 4)
    return total


def operand_limit_bytes() -> int:
    """The ORACLE_MAX_OPERAND_MB knob, in bytes."""
    from oracle import knobs

    return knobs.MAX_OPERAND_MB.get() << 20


def operand_limit():
    """The ORACLE_MAX_OPERAND_MB knob as a budget limit."""
    from harness import budget

    mb = operand_limit_bytes() >> 20
    return budget.Limit(mb << 20, f"the {mb} MiB limit of ORACLE_MAX_OPERAND_MB")


def draw_bytes(spec: ProblemSpec, generator: str = "cpu") -> int:
    """Host bytes make_operands holds beside the operands while it makes them: the draws of A and B
    (float64 on the CPU generator, float32 on the GPU's), a grouped B's draws twice (the list and
    its stack); a quantised operand's values are drawn in float64 with their int64 codes (16 bytes
    an element) and its scales and zero points in float64, whichever generator draws them."""
    each = 8 if generator == "cpu" else 4
    groups = len(spec.group_sizes or (1,)) if spec.k_groups is None else 1  # the Bs drawn
    op = spec.quant_op
    if op is None:
        return each * (spec.a_rows * spec.k + spec.k * spec.n * groups * (2 if groups > 1 else 1))
    lines = spec.n if op == "b" else spec.total_m  # the quantised operand's lines along K
    other = spec.total_m * spec.k if op == "b" else spec.k * spec.n  # the float operand, drawn plainly
    return 16 * spec.k * lines + 16 * spec.quant_groups * lines + 8 * other


def check_problem_size(spec: ProblemSpec, extra: int = 0, extra_what: str = "", *,
                       generator: Optional[str] = None) -> None:
    """Refuse a problem whose operands and output (plus `extra` bytes of `extra_what`: a case's
    workspaces, a reproducer's reference D) cannot be held: InputError naming the sizes and the
    limit. Made before any input is allocated, against one budget (harness.budget): the
    ORACLE_MAX_OPERAND_MB knob; the host's physical memory and address-space headroom, for them
    plus the draws that make_operands holds while it makes them (draw_bytes); a visible GPU's free
    memory. With `generator` (make_operands' own check) the draws count against the knob too."""
    from harness import budget

    need = operand_bytes(spec) + extra
    what = f"the operands and output of {spec.describe()}" + (f" and {extra_what}" if extra_what else "")
    draws = draw_bytes(spec, generator or "cpu")
    budget.require(need, what, InputError, knob=operand_limit(), host=False, verb="take",
                   advice="choose a smaller problem or raise the limit")
    if generator is not None:  # the operands fit: with the draws beside them?
        budget.require(need + draws, f"{what}, with the draws that make them ({draws / 2**20:.1f} MiB)",
                       InputError, knob=operand_limit(), host=False, verb="take",
                       advice="choose a smaller problem or raise the limit")
    budget.require(need, what, InputError, host=True, host_need=need + draws, verb="take",
                   advice=f"making them holds {draws / 2**20:.1f} MiB of draws beside them; choose a smaller "
                          f"problem")
    budget.require(need, what, InputError, host=False, device=True, verb="take", advice="choose a smaller problem")


def _cast(x: torch.Tensor, name: str) -> torch.Tensor:
    return x.to(DTYPES[name].torch).cpu()


def _index_grid(name: str) -> tuple[int, int]:
    """(P, Q): values 1..P*Q are exact integers in the dtype."""
    return {"fp32": (2048, 2048), "fp16": (32, 64), "bf16": (16, 16), "e4m3": (4, 4),
            "e5m2": (2, 4), "int8": (8, 15)}[name]


def index_values(rows: int, cols: int, name: str) -> torch.Tensor:
    """value = (r mod P) * Q + (c mod Q) + 1: an exact integer in dtype `name`."""
    p, q = _index_grid(name)
    r = torch.arange(rows).remainder(p)[:, None]
    c = torch.arange(cols).remainder(q)[None, :]
    return (r * q + c + 1).to(torch.float64)


def decode_index(value: float, name: str) -> Optional[tuple[int, int]]:
    """The (row mod P, col mod Q) an index-encoded value came from, or None if it is not one."""
    p, q = _index_grid(name)
    if not math.isfinite(value) or value != int(value) or not 1 <= value <= p * q:
        return None
    v = int(value) - 1
    return v // q, v % q


def make_operands(spec: ProblemSpec, ladder: str = "random", seed: int = 0, generator: str = "cpu") -> Operands:
    """Controlled inputs for `spec` (CPU tensors).

    `generator` names the device whose random generator draws the random ladder: "cpu" (float64
    draws, the default) or "cuda" (float32 draws on the GPU, then copied back: a 4096^2 problem's
    inputs in milliseconds instead of a second or more). The same seed gives different values on
    the two; each is reproducible, and Provenance.generator records which was used."""
    if ladder not in LADDER:
        raise InputError(f"input ladder {ladder!r} is unknown; choose one of {', '.join(LADDER)} or dump:PATH")
    if generator not in ("cpu", "cuda"):
        raise InputError(f"generator {generator!r} must be 'cpu' or 'cuda'")
    check_problem_size(spec, generator=generator)
    m, n, k = spec.a_rows, spec.n, spec.k
    n_groups = len(spec.group_sizes) if spec.group_sizes is not None and spec.k_groups is None else None
    g = torch.Generator(device=generator).manual_seed(seed)
    draw = torch.float64 if generator == "cpu" else torch.float32
    shapes = expected_shapes(spec)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=draw, device=generator) * scale

    if ladder == "scales" and not spec.block_scaled:
        raise InputError("the scales ladder sets a block-scaled problem's scales (scale_a.kind and scale_b.kind "
                         "block): this problem has none; use ones, index, ktag or random")
    qop = spec.quant_op
    if qop is not None:
        if ladder == "ktag":
            raise InputError(f"the ktag ladder tags B's values, and a quantised {qop.upper()} is stored as codes: use "
                             f"ones, index or random")
        fop = "b" if qop == "a" else "a"  # the float operand, drawn as a plain one
        rows, cols = (k, n) if fop == "b" else (m, k)
        fl = torch.ones(rows, cols) if ladder == "ones" else index_values(rows, cols, spec.mma_dtype) \
            if ladder == "index" else rnd(rows, cols)
        quant = dict(zip((qop, f"{qop}_scales", f"{qop}_zeros"), _quantised(spec, qop, ladder, g, generator)))
        c, bias = None, None
        if shapes["c"] is not None:
            c = _cast(rnd(*shapes["c"]).float() if ladder == "random" else torch.ones(shapes["c"]), spec.c_dtype)
        if shapes["bias"] is not None:
            bias = _cast(rnd(*shapes["bias"]).float() if ladder == "random" else torch.ones(shapes["bias"]),
                         spec.bias_dtype)
        ones = {n_: torch.ones(shapes[n_]) for n_ in ("scale_a", "scale_b") if shapes[n_] is not None}
        return Operands(**{fop: _cast(fl, spec.mma_dtype)}, **quant, c=c, bias=bias, scale_a=ones.get("scale_a"),
                        scale_b=ones.get("scale_b"))
    if ladder in ("ones", "scales"):
        a, b = torch.ones(m, k), torch.ones(k, n)
    elif ladder == "index":  # a K-grouped problem's groups each encoded from the group's first k
        a = torch.cat([index_values(m, kg, spec.a_dtype) for kg in _k_pieces(spec)], 1)
        b = torch.cat([index_values(kg, n, spec.b_dtype) for kg in _k_pieces(spec)], 0)
    elif ladder == "ktag":  # a K-grouped problem's k-blocks counted from each group's first k
        a = torch.ones(m, k)
        kb = torch.cat([torch.arange(kg) // spec.tile.bk for kg in _k_pieces(spec)])
        b = (2.0 ** (kb % KTAG_PERIOD)).to(torch.float64)[:, None].expand(k, n).clone()
    else:
        if spec.a_dtype == "int8":
            a = torch.randint(-8, 9, (m, k), generator=g, device=generator).to(draw)
            b = torch.randint(-8, 9, (k, n), generator=g, device=generator).to(draw)
        else:
            a, b = rnd(m, k), rnd(k, n)
    if n_groups is not None:  # one B per group: random ones differ, controlled ones repeat
        if ladder == "random":
            rest = [b.to(draw)] + [(torch.randint(-8, 9, (k, n), generator=g, device=generator).to(draw)
                                    if spec.a_dtype == "int8" else rnd(k, n)) for _ in range(n_groups - 1)]
            b = torch.stack([x.to(draw) for x in rest])
        else:
            b = b[None].expand(n_groups, k, n).clone()
    a, b = _cast(a, spec.a_dtype), _cast(b, spec.b_dtype)

    def aux(name):
        shape = shapes[name]
        if shape is None:
            return None
        if ladder == "random":
            if name.startswith("scale"):
                return (torch.rand(*shape, generator=g, dtype=draw, device=generator) * 1.5 + 0.5).float().cpu()
            return rnd(*shape).float()
        if ladder == "scales" and name in ("scale_a", "scale_b"):
            return pow2_scales(spec, name)
        if ladder == "index" and name in ("c", "bias"):
            return torch.arange(math.prod(shape), dtype=torch.float32).remainder(64).reshape(shape)
        return torch.ones(shape, dtype=torch.float32)

    c = aux("c")
    if c is not None:
        c = _cast(c, spec.c_dtype)
    bias = aux("bias")
    if bias is not None:
        bias = _cast(bias, spec.bias_dtype)
    return _store_block_scales(spec, Operands(a=a, b=b, c=c, bias=bias, scale_a=aux("scale_a"),
                                              scale_b=aux("scale_b")))


def _k_pieces(spec: ProblemSpec) -> tuple[int, ...]:
    """The extents along K that the controlled ladders encode on their own: each group's of a
    K-grouped problem (so each group is a controlled problem by itself), else all of K."""
    return spec.k_groups if spec.k_groups is not None else (spec.k,)


def _quantised(spec: ProblemSpec, op: str, ladder: str, g: torch.Generator, generator: str):
    """The stored quantised operand `op`, its scales and zero points for a ladder (module docstring):
    drawn with K along the rows (n: B's columns, or A's rows), A's then transposed to [M, ...]."""
    from kernels_ref import dequant as dq
    from kernels_ref.scales import e8m0_codes

    cfg = spec.dequant_config
    k, n, groups = spec.k, (spec.n if op == "b" else spec.m), spec.quant_groups
    qd, sd, zk = cfg.dtype, cfg.scale_dtype, cfg.zeros
    d = ALL_TYPES[qd]
    kk = torch.arange(k)[:, None]
    nn = torch.arange(n)[None, :]
    gg = torch.arange(groups)[:, None]
    if ladder == "ones":
        q = torch.ones(k, n, dtype=torch.float64) + cfg.centre
        s = torch.ones(groups, n, dtype=torch.float64)
        z = torch.zeros(groups, n, dtype=torch.float64)
    elif ladder == "index":
        if qd in ("int4", "uint4", "int8"):
            q = ((kk % 8) + 8 * (nn % 4) if qd == "int8" else (kk % 8) + 2 * (nn % 4)) % (d.max_finite + 1)
            q = (q - (4 if qd == "int4" else 0)).double()
        else:  # e2m1 / fp8: small exact values, k first
            small = ((kk % 4) + (nn % 4)).long()
            q = torch.tensor(dq._FP4, dtype=torch.float64)[small % 8] if qd == "fp4_e2m1" else small.double()
        s = 1.0 + ((gg + 3 * nn) % 8).double() / 8
        if sd == "e8m0":
            s = torch.pow(2.0, ((gg + nn) % 4).double())
        z = ((gg + nn) % 3).double()
        if zk in ("float", "float_offset"):
            z = z / 2
    else:
        lo, hi = int(d.lowest), int(d.max_finite)
        if qd in ("int4", "uint4", "int8"):
            q = torch.randint(lo, hi + 1, (k, n), generator=g, device=generator).double().cpu()
        elif qd == "fp4_e2m1":
            q = dq.values_of_codes(torch.randint(0, 16, (k, n), generator=g, device=generator).cpu(), "fp4_e2m1")
        else:
            q = torch.randn(k, n, generator=g, dtype=torch.float64 if generator == "cpu" else torch.float32,
                            device=generator).cpu().to(d.torch).double()
        u = torch.rand(groups, n, generator=g, dtype=torch.float64 if generator == "cpu" else torch.float32,
                       device=generator).cpu().double()
        s = (u + 0.5) / 8
        if sd == "e8m0":
            s = torch.pow(2.0, -(u * 4).floor() - 2)
        zr = torch.zeros(groups, n, dtype=torch.float64)
        if qd in ("int4", "uint4", "int8"):
            zr = torch.randint(lo, hi + 1, (groups, n), generator=g, device=generator).cpu().double()
        z = zr if zk != "float" else zr.abs() % 8 + u
        if zk == "float_offset":
            z = u - 0.5
    stored = dq.pack_host(dq.codes_of_values(q, qd), cfg)
    scales = e8m0_codes(s) if sd == "e8m0" else s.to(ALL_TYPES[sd].torch)
    zeros = None if zk == "none" else z.to(cfg.zero_torch())
    if op == "a":
        return tuple(None if x is None else x.t().contiguous() for x in (stored, scales, zeros))
    return stored, scales, zeros


def analytic_ones_value(spec: ProblemSpec, k: Optional[int] = None) -> Optional[float]:
    """With the 'ones' ladder every output element is this value (before the output cast); `k`: the
    K summed (a K-grouped problem's group's; default the problem's)."""
    x = float(spec.k if k is None else k)
    for node in spec.epilogue_nodes:  # in the declared order, with its roundings
        step = node.step
        if step in ("alpha_beta", "alpha"):
            x = spec.alpha * x
        if step in ("alpha_beta", "beta_c"):
            x = x + spec.beta * 1.0
        if step == "bias" and spec.bias != "none":
            x = x + 1.0
        if step == "activation":
            x = _activation_value(spec.activation, x)
        if node.rounds:
            x = float(torch.tensor(x, dtype=torch.float32).to(DTYPES[node.round].torch))
    return x


def _activation_value(act: str, x: float) -> float:
    if act == "relu":
        x = max(x, 0.0)
    elif act == "gelu_erf":
        x = 0.5 * x * (1 + math.erf(x / math.sqrt(2)))
    elif act == "gelu_tanh":
        x = 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    elif act == "silu":
        x = x / (1 + math.exp(-x)) if x > -700 else 0.0
    return x


def ktag_expected_code(spec: ProblemSpec, k_blocks: int) -> float:
    """sum over k-blocks 0..k_blocks-1 of BK*2^(j mod T) with ragged last block: the ktag
    accumulator after `k_blocks` blocks (A = 1)."""
    bk = spec.tile.bk
    total = 0.0
    for j in range(k_blocks):
        width = min(bk, spec.k - j * bk)
        total += width * 2.0 ** (j % KTAG_PERIOD)
    return total


def decode_ktag(diff: float, bk: int) -> Optional[str]:
    """Explain an accumulator error under the ktag ladder: which k-block (mod T) is extra or missing."""
    if not math.isfinite(diff) or diff == 0:
        return None
    units = diff / bk
    mag = abs(units)
    j = round(math.log2(mag)) if mag > 0 else None
    if j is None or 2.0**j != mag or not 0 <= j < KTAG_PERIOD:
        return None
    what = "summed once too often" if units > 0 else "missing"
    return f"a k-block j with j mod {KTAG_PERIOD} = {j} was {what}"
