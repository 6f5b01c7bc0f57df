"""The oracle from Python: check a GEMM-like result, judge a recording, run a live case.

    import oracle
    report = oracle.check(a, b, d, bias=bias, activation="gelu_erf")   # output only, any device
    assert report.verdict == "MATCH", report
    oracle.assert_gemm_close(a, b, d)                                  # raises AssertionError(report)

`check` builds the problem from the tensors (A logical [M, K], B [K, N], D [M, N]; their dtypes
and, where given, C, bias and scales) and any other ProblemSpec field as a keyword (acc_model,
tile, alpha, beta, out_dtype, ...), wraps D as an output-only recording (no taps: every stage
inside the kernel is unobserved, so only the output is judged, per tile, with the spec's numerics
model) and runs the differential.

Every call walks the one path (`compare`): a RunRequest (oracle.run.request) -> run
(oracle.run.execute) -> judge (oracle.judging.judgement) -> a Report, which renders itself. The
command line, bench and the pytest plugin are built on these functions, and `run_live` takes
every option the command line's compare does.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from kernels_ref.dtypes import name_of
from oracle.run.inputs import Operands, Provenance
from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile
from oracle.run.recording import Recording

DUMP_DIR_ENV = "ORACLE_DUMP_DIR"  # where assert_gemm_close saves a dump of every failing check


def _of_judgement(name: str, doc: str) -> property:
    """A read-only attribute of a Report that is its judgement's own `name`."""
    return property(lambda self: getattr(self.judgement, name), doc=doc)


@dataclass(frozen=True)
class Report:
    """What the oracle found: `verdict` ("MATCH", "DIVERGED", ...: the final one, NONDETERMINISTIC
    when repeated runs differ), `first_divergence` (None or
    oracle.judging.differential.FirstDivergence), `stages` (per stage: teacher-forced and chained
    comparisons), `judgement` (everything: races, sanitizer, timings, phases), `to_json()` (schema
    oracle.report.table/2), `to_html()` (one self-contained page, oracle.report.html); str() is the
    table and the sentence. Made from a Judgement (or an Analysis alone); `request` is the
    RunRequest that made it, when known (the page's re-run commands come from it)."""

    judgement: Any  # oracle.judging.judgement.Judgement
    request: Any = field(default=None, compare=False)  # oracle.run.request.RunRequest

    def __post_init__(self) -> None:
        from oracle.report.table import as_judgement

        object.__setattr__(self, "judgement", as_judgement(self.judgement))

    analysis = _of_judgement("analysis", "the stage table as told (oracle.judging.differential.Analysis)")
    ok = _of_judgement("ok", "True when the final verdict is MATCH")
    first_divergence = _of_judgement("first", "the first divergence as told, or None")
    recording = _of_judgement("recording", "the recording judged (oracle.run.recording.Recording)")
    exit_code = _of_judgement("exit_code", "the process exit code of the final verdict")

    @property
    def verdict(self) -> str:
        return self.judgement.verdict.value

    @property
    def stages(self):
        return self.analysis.stages

    def to_json(self, extra: Optional[dict] = None) -> dict:
        from oracle.report import table as report

        return report.to_json(self.judgement, extra)

    def to_html(self, commands: Optional[Sequence] = None, *, dump: Optional[str] = None) -> str:
        """The report as one self-contained HTML page; `commands` (oracle.report.html.Command) that
        re-run it, by default those of the request (oracle.tools.rerun), `dump` a saved recording."""
        from oracle.report import html

        return html.render(self.judgement, self._commands(commands, dump))

    def write_html(self, path: str, commands: Optional[Sequence] = None, *, dump: Optional[str] = None) -> str:
        """to_html() written to `path` whole, never through a link; returns the path."""
        from oracle.report import html

        html.write_html(self.judgement, path, self._commands(commands, dump))
        return path

    def _commands(self, commands: Optional[Sequence], dump: Optional[str]) -> tuple:
        if commands is not None:
            return tuple(commands)
        from oracle.tools.rerun import commands_for

        return commands_for(self.request, dump=dump)

    def __str__(self) -> str:
        from oracle.report import table as report

        return report.render(self.judgement)


def compare(request) -> Report:
    """The one path every entry point walks: run what the RunRequest asks, judge what it gave."""
    from oracle.judging.judgement import judge
    from oracle.run.execute import run
    from oracle.tools.startup import import_judgement

    return Report(judge(run(request, while_running=import_judgement)), request)


def _dtype(name: str, t: Optional[torch.Tensor]) -> str:
    try:
        return name_of(t.dtype)
    except ValueError:
        raise SpecError(f"{name} has dtype {t.dtype}, which the oracle has no name for") from None


def _check_tensor(name: str, t: Any, scale: bool = False) -> None:
    """One argument of `check`: a dense torch.Tensor with data (any real device), of a real dtype, not nested."""
    if not isinstance(t, torch.Tensor):
        raise SpecError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested:  # before anything reads its sizes: a nested tensor has none to give
        raise SpecError(f"{name} is a nested tensor (torch.nested): the oracle reads one dense matrix; check each "
                        f"component on its own, or pass {name}.to_padded_tensor(0)")
    if t.layout is not torch.strided:
        raise SpecError(f"{name} is a {t.layout} tensor; the oracle reads dense (strided) tensors: pass "
                        f"{name}.to_dense()")
    if t.device.type == "meta":
        raise SpecError(f"{name} is a meta tensor: it has a shape but no values to judge")
    if t.is_complex() or t.dtype == torch.bool:
        raise SpecError(f"{name} has dtype {t.dtype}; a GEMM's tensors are real numbers")
    if scale and not t.is_floating_point() and t.dtype != torch.uint8:
        raise SpecError(f"{name} has dtype {t.dtype}; a scale is a floating-point tensor (or uint8: the e8m0 "
                        f"exponents of an OCP MX block scale)")


def _quant_fields(op: str, a: torch.Tensor, b: torch.Tensor, scales, zeros, fields: dict) -> dict:
    """The ProblemSpec fields the quantised operand `op`'s tensors imply (<op>_scales, <op>_zeros,
    <op>_group_size): B stored [K / per, N] with scales [K / group, N], or A stored [M, K / per]
    with scales [M, K / group]; the zero points' form is their dtype's (int or float) unless
    `<op>_zeros_kind` names it (float_offset: w = (q - c) * s + z)."""
    from kernels_ref.dtypes import ALL_TYPES, QUANT_B

    X, stored, kd = op.upper(), (a if op == "a" else b), (1 if op == "a" else 0)  # kd: K's dim of the stored tensor
    _check_tensor(f"{op}_scales", scales)
    qd = fields.get(f"{op}_dtype")
    if qd not in QUANT_B:
        raise SpecError(f"{op}_dtype={qd!r} is not allowed: a check with {op}_scales needs the stored type of {X}, one "
                        f"of {', '.join(QUANT_B)}")
    grid = "[M, K / group]" if op == "a" else "[K / group, N]"
    if scales.dim() != 2:
        raise SpecError(f"{op}_scales must be 2-D {grid}, got {list(scales.shape)}")
    plain = b if op == "a" else a  # the float operand holds K whole
    k = (plain.shape[0] if op == "a" else plain.shape[1]) if plain.dim() == 2 else 0
    per = ALL_TYPES[qd].per_item
    if stored.dim() != 2 or stored.shape[kd] * per != k:
        shape = f"[M, {k // per}]" if op == "a" else f"[{k // per}, N]"
        raise SpecError(f"{op} has shape {list(stored.shape)}: a {qd} {X} of K = {k} is stored as {shape}"
                        + (" (two k a byte)" if per > 1 else ""))
    lines = stored.shape[1 - kd]
    if scales.shape[1 - kd] != lines or scales.shape[kd] == 0 or k % scales.shape[kd]:
        raise SpecError(f"{op}_scales has shape {list(scales.shape)}: it must be {grid} with "
                        f"{'M' if op == 'a' else 'N'} = {lines} and a number of groups that divides K = {k}")
    sd = "e8m0" if scales.dtype in (torch.uint8, getattr(torch, "float8_e8m0fnu", None)) else \
        _dtype(f"{op}_scales", scales)
    out = {f"{op}_scales": sd, f"{op}_group_size": k // scales.shape[kd]}
    kind = fields.pop(f"{op}_zeros_kind", None)
    if zeros is not None:
        _check_tensor(f"{op}_zeros", zeros)
        out[f"{op}_zeros"] = kind or ("float" if zeros.is_floating_point() else "int")
        if out[f"{op}_zeros"] in ("float", "float_offset") and not zeros.is_floating_point():
            raise SpecError(f"{op}_zeros has dtype {zeros.dtype}: {op}_zeros_kind={out[f'{op}_zeros']!r} zero points "
                            f"are floats in the scales' dtype")
    elif kind is not None:
        raise SpecError(f"{op}_zeros_kind={kind!r} was given without {op}_zeros")
    return out


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


REFERENCE_TILE_ELEMENTS = 1 << 20  # the most elements one tile of the Triton references may hold (Triton's limit)


def fitted_tile(tile: Tile, m: int, n: int, k: int) -> Tile:
    """The tile a check judges with: each extent at most what covers its dimension of the problem
    (the power of two at or above M, N or K, or the default tile's extent if larger), so a tile far
    larger than the problem sizes nothing by itself; one tile (or k-block) covers the dimension
    before and after, so the partition of the output and of K is the same. A tile still too large
    for the references is a SpecError."""
    d = Tile()
    fit = Tile(min(tile.bm, max(_pow2_at_least(m), d.bm)), min(tile.bn, max(_pow2_at_least(n), d.bn)),
               min(tile.bk, max(_pow2_at_least(k), d.bk)))
    for x, y, names in ((fit.bm, fit.bn, "bm x bn"), (fit.bm, fit.bk, "bm x bk"), (fit.bn, fit.bk, "bn x bk")):
        if x * y > REFERENCE_TILE_ELEMENTS:
            raise SpecError(f"tile={tile.bm}x{tile.bn}x{tile.bk} is not allowed: its {names} = {x * y} elements "
                            f"on this {m}x{n}x{k} problem, more than the {REFERENCE_TILE_ELEMENTS} one tile of the "
                            f"references may hold; give a smaller tile")
    return fit


def _tile_note(asked: Tile, used: Tile) -> Optional[str]:
    if asked == used:
        return None
    return (f"tile {asked.bm}x{asked.bn}x{asked.bk} is larger than the problem: judged with {used.bm}x{used.bn}x"
            f"{used.bk}, which covers the same tiles and k-blocks")


_E8M0 = getattr(torch, "float8_e8m0fnu", None)


def _block_scale_dtype(t: torch.Tensor) -> Optional[str]:
    """The stored dtype a scale tensor's torch dtype names when it can only be a block scale (uint8 or
    float8_e8m0fnu: OCP MX e8m0 exponents; float8_e4m3fn: NVFP4-style e4m3), else None."""
    if t.dtype in (torch.uint8, _E8M0):
        return "e8m0"
    return "e4m3" if t.dtype == torch.float8_e4m3fn else None


def _scale_of(t: Optional[torch.Tensor], scale: Scale) -> Optional[torch.Tensor]:
    """A scale as the recording holds it: fp32, flat; a block scale keeps its logical 2-D grid in its
    stored dtype (e8m0 as raw bytes), whatever its storage order."""
    if t is None:
        return None
    t = t.detach()
    if scale.kind != "block":
        return t.float().reshape(-1)
    if scale.dtype == "e8m0":
        return (t.view(torch.uint8) if t.dtype == _E8M0 else t).contiguous()
    return t.contiguous() if scale.dtype == "e4m3" else t.float().contiguous()


def _block_scale(s: torch.Tensor, rows: int, k: int) -> Scale:
    """The Scale a 2-D block scale tensor [ceil(rows / g), ceil(K / gk)] describes: each block extent the
    power of two that covers it, the dtype its torch dtype names (else fp32 values), and its storage
    order (`col`: its rows contiguous, as DeepGEMM's MN-major scales)."""
    block = (_pow2_at_least(-(-rows // s.shape[0])), _pow2_at_least(-(-k // s.shape[1])))
    col = s.shape[0] > 1 and s.shape[1] > 1 and s.stride(0) == 1 and s.stride(1) != 1
    return Scale("block", block, "col" if col else "row", _block_scale_dtype(s) or "fp32")


def _stored_scales(t: torch.Tensor) -> torch.Tensor:
    """e8m0 scales as their raw bytes (kernels_ref.dequant's form)."""
    if t.dtype == getattr(torch, "float8_e8m0fnu", None):
        return t.view(torch.uint8)
    return t


def problem_of(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, *, c=None, bias=None, scale_a=None, scale_b=None,
               b_scales=None, b_zeros=None, a_scales=None, a_zeros=None, **fields) -> ProblemSpec:
    """The ProblemSpec a check of these tensors describes; `fields` override or add ProblemSpec fields.
    Every argument is checked first: a SpecError names the one that is not a dense, real tensor
    with values (meta, sparse, complex, bool and non-tensors are refused), or does not fit. The
    tensors may be on different devices: the differential moves them to the reference device."""
    for name, t in (("a", a), ("b", b), ("d", d)):
        _check_tensor(name, t)
    for name, t in (("c", c), ("bias", bias), ("scale_a", scale_a), ("scale_b", scale_b)):
        if t is not None:
            _check_tensor(name, t, scale=name.startswith("scale"))
    for name, t in (("a", a), ("b", b), ("d", d)):
        if t.dim() != 2:
            raise SpecError(f"{name} must be a 2-D torch.Tensor (A [M, K], B [K, N], D [M, N]), got "
                            f"{list(t.shape)}")
    quant, qop = {}, None
    if a_scales is not None and b_scales is not None:
        raise SpecError("a_scales and b_scales were both given: exactly one operand may be quantised")
    for op, sc, zs in (("a", a_scales, a_zeros), ("b", b_scales, b_zeros)):
        if sc is not None:
            quant, qop = _quant_fields(op, a, b, sc, zs, fields), op
        elif zs is not None:
            raise SpecError(f"{op}_zeros was given without {op}_scales: a quantised {op.upper()} needs its scales")
        elif f"{op}_zeros_kind" in fields:
            raise SpecError(f"{op}_zeros_kind was given without {op}_scales and {op}_zeros: it names a quantised "
                            f"{op.upper()}'s zero points")
    (m, k), (k2, n) = a.shape, b.shape
    if qop == "b":
        k2 = k
    elif qop == "a":
        k = k2
    if k2 != k:
        raise SpecError(f"b has {k2} rows but a has {k} columns: A is [M, K] and B is [K, N]")
    kg = fields.get("k_groups")
    if isinstance(kg, list):
        kg = fields["k_groups"] = tuple(kg)
    groups_k = len(kg) if isinstance(kg, tuple) else None  # a K-grouped check: D holds G outputs [M, N]
    if groups_k is not None and tuple(d.shape) != (groups_k * m, n):
        raise SpecError(f"d has shape {list(d.shape)}: a K-grouped problem of {groups_k} groups writes one [{m}, {n}] "
                        f"output per group, D [{groups_k * m}, {n}]")
    if groups_k is None and tuple(d.shape) != (m, n):
        raise SpecError(f"d has shape {list(d.shape)}, A @ B is [{m}, {n}]")
    kw: dict[str, Any] = dict(m=m, n=n, k=k, a_dtype=fields.pop("a_dtype") if qop == "a" else _dtype("a", a),
                              b_dtype=fields.pop("b_dtype") if qop == "b" else _dtype("b", b), out_dtype=_dtype("d", d),
                              **quant)
    if kw["a_dtype"] == "int8" and qop is None:
        kw["acc_dtype"] = "int32"
    if c is not None:
        kw.update(c_dtype=_dtype("c", c), beta=fields.pop("beta", 1.0))
    if bias is not None:
        rows = d.shape[0]  # D's rows: a K-grouped problem's column bias is one per group, [G, N]
        kw.update(bias_dtype=_dtype("bias", bias),
                  bias=fields.pop("bias_axis", "row" if bias.dim() == 1 and bias.numel() == rows != n else "col"))
    for op, s, axis in (("a", scale_a, "row"), ("b", scale_b, "col")):
        if s is None:
            continue
        rows = m if op == "a" else n
        if s.dim() == 2 and (s.shape[1] > 1 or s.shape[0] != rows or _block_scale_dtype(s)):
            kw[f"scale_{op}"] = _block_scale(s, rows, k)  # a block scale [rows / g, K / gk]
        elif _block_scale_dtype(s):
            raise SpecError(f"scale_{op} has dtype {s.dtype}, a block scale's stored type: give it as the 2-D grid "
                            f"[{'M' if op == 'a' else 'N'} / block rows, K / block k]")
        else:
            kw[f"scale_{op}"] = Scale("tensor" if s.numel() == 1 else axis)
    try:
        if isinstance(fields.get("tile"), (list, tuple)):
            fields["tile"] = Tile(*fields["tile"])
        if isinstance(fields.get("tile"), Tile):  # fitted before any size is taken from it
            fields["tile"] = fitted_tile(fields["tile"], m, n, k)
        kw.update(fields)
        return ProblemSpec(**kw)
    except TypeError as e:
        raise SpecError(f"check: {e}") from None


def recording_of(a, b, d, *, c=None, bias=None, scale_a=None, scale_b=None, b_scales=None, b_zeros=None,
                 a_scales=None, a_zeros=None, kernel: str = "check", **fields) -> Recording:
    """An output-only recording of D = f(A, B, ...) for the differential (no taps)."""
    spec = problem_of(a, b, d, c=c, bias=bias, scale_a=scale_a, scale_b=scale_b, b_scales=b_scales, b_zeros=b_zeros,
                      a_scales=a_scales, a_zeros=a_zeros, **fields)
    col_per_group = spec.k_groups is not None and spec.bias == "col"  # [G, N]
    ops = Operands(a=a.detach(), b=b.detach(), c=None if c is None else c.detach(),
                   bias=None if bias is None else bias.detach().reshape((len(spec.k_groups), -1) if col_per_group
                                                                        else (-1,)),
                   scale_a=_scale_of(scale_a, spec.scale_a), scale_b=_scale_of(scale_b, spec.scale_b),
                   b_scales=None if b_scales is None else _stored_scales(b_scales.detach()),
                   b_zeros=None if b_zeros is None else b_zeros.detach(),
                   a_scales=None if a_scales is None else _stored_scales(a_scales.detach()),
                   a_zeros=None if a_zeros is None else a_zeros.detach())
    asked = fields.get("tile")
    asked = Tile(*asked) if isinstance(asked, (list, tuple)) else asked
    note = _tile_note(asked, spec.tile) if isinstance(asked, Tile) else None
    rec = Recording(spec=spec, operands=ops, output=d.detach(), provenance=Provenance("captured"), kernel=kernel,
                    notes=(note,) if note else ())
    rec.validate()
    return rec


def check(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, *, c: Optional[torch.Tensor] = None,
          bias: Optional[torch.Tensor] = None, scale_a: Optional[torch.Tensor] = None,
          scale_b: Optional[torch.Tensor] = None, b_scales: Optional[torch.Tensor] = None,
          b_zeros: Optional[torch.Tensor] = None, a_scales: Optional[torch.Tensor] = None,
          a_zeros: Optional[torch.Tensor] = None, **problem_fields) -> Report:
    """Judge an output D of a GEMM-like op against the oracle's reference and bounds, tile by tile.

    A [M, K], B [K, N] (logical; any strides), D [M, N], torch tensors on any device; C [M, N],
    bias [N] (or [M] with bias_axis="row"), scale_a / scale_b per tensor ([1]) or per row / column,
    or block scales of fp8 operands ([M / g, K / gk] and [N / g, K / gk], 2-D: the block is the
    power of two that covers each extent, 1 x 128 and 128 x 128 for DeepSeek-style scales; a grid
    whose rows are contiguous is MN-major; float32 values, uint8 or float8_e8m0fnu OCP MX exponents
    (1 x 32), float8_e4m3fn NVFP4-style scales (1 x 16); groups narrower than the k-block are judged
    per group, K any size: ceil(K / gk) groups, the last one possibly partial).
    Every other ProblemSpec field may be given as a keyword (acc_model, tile, alpha, beta,
    activation, saturate, ...). The bound is the accumulation model's (acc_model, reduction): the
    default is an fp32 accumulator over the problem's tiles; a D from cuBLAS or another engine
    that may split K and round its partials needs the model it follows (acc_model="any" is sound
    for every engine measured; `python -m oracle verify` picks it for torch ops). A quantised B:
    B as stored, with `b_scales` (and `b_zeros`; `b_zeros_kind="float_offset"` for zero points added
    after the scale, w = (q - c) * s + z, as torch's tinygemm int4 kernel computes) and the fields
    b_dtype and b_packing (module docstring). A quantised A (the swapped problem of a mixed-input
    kernel) is the same with A as stored [M, K / per], `a_scales` / `a_zeros` [M, K / group],
    `a_zeros_kind`, a_dtype and a_packing, beside an fp16 / bf16 B. Raises SpecError /
    RecordingError for tensors that do not make a problem.

    A K-grouped GEMM (an MoE weight gradient): `k_groups` = [K_0, K_1, ...] (0 allowed, adding up
    to K); group g multiplies A's columns and B's rows [k0_g, k0_g + K_g) into its own output, D
    [G * M, N] holding them one after the other (C alike; a column bias [G, N], one per group).
    Each group is judged as its own GEMM, an empty one against the epilogue of a zero accumulator."""
    from oracle.run.request import RunRequest

    rec = recording_of(a, b, d, c=c, bias=bias, scale_a=scale_a, scale_b=scale_b, b_scales=b_scales,
                       b_zeros=b_zeros, a_scales=a_scales, a_zeros=a_zeros, **problem_fields)
    return compare(RunRequest(recording=rec))


def check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                    lse: Optional[torch.Tensor] = None, *, causal: Any = False, window=None,
                    softmax_scale: Optional[float] = None, softcap: float = 0.0,
                    cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
                    page_table: Optional[torch.Tensor] = None, **fields) -> Report:
    """Judge an attention forward's O (and LSE) against the reference attention and its bound, per
    unit (batch * heads_q + head, query block), through the same path as `check`.

    Tensors in FlashAttention's layout: q [batch, seqlen_q, heads_q, head_dim], k / v [batch,
    seqlen_k, heads_kv, dim], o like q, lse [batch, heads_q, seqlen_q] fp32 (torch SDPA's
    [batch, heads, seqlen, dim] tensors: transpose(1, 2) first). Variable lengths: cu_seqlens_q /
    cu_seqlens_k with packed [total, heads, dim] tensors (lse [heads_q, total_q]); a paged cache: k / v
    [num_pages, page_size, heads_kv, dim] and page_table [batch, max_pages]. causal True is
    FlashAttention's bottom-right alignment; "top_left" is SDPA's is_causal. window (left, right),
    -1 unbounded. Other AttentionSpec fields as keywords (block_q, block_kv, splits, descale_q /
    _k / _v and p_scale for e4m3, empty_lse="+inf" for FlashAttention-2's fully masked rows).
    Raises SpecError / RecordingError for tensors that do not make a problem."""
    from oracle.run.request import RunRequest
    from oracle.tools.attention_check import attention_recording_of

    rec = attention_recording_of(q, k, v, o, lse, causal=causal, window=window, softmax_scale=softmax_scale,
                                 softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                 page_table=page_table, **fields)
    return compare(RunRequest(recording=rec))


def attention_problem_of(*args, **kwargs):
    """The AttentionSpec a check_attention of these tensors describes (oracle.tools.attention_check)."""
    from oracle.tools.attention_check import attention_problem_of as of

    return of(*args, **kwargs)


def attention_recording_of(*args, **kwargs):
    """An output-only attention recording (oracle.tools.attention_check)."""
    from oracle.tools.attention_check import attention_recording_of as of

    return of(*args, **kwargs)


def assert_gemm_close(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, *, html_path: Optional[str] = None,
                      **kwargs) -> Report:
    """`check`, raising AssertionError unless MATCH: its first line the verdict and where (pytest's
    short summary shows it: "DIVERGED at epilogue_store, tile (0, 1), element (5, 17) (DRAFT)"),
    then the stage table and the first divergence.
    With ORACLE_DUMP_DIR set (the pytest plugin's --oracle-dump-dir), a failing check is saved as a
    dump there first, for `python -m oracle compare --dump FILE`; with `html_path` (the pytest
    plugin gives one) its HTML page is written there, and the message names both."""
    rep = check(a, b, d, **kwargs)
    if not rep.ok:
        raise AssertionError(failure_message(rep, html_path))
    return rep


def failure_message(rep: Report, html_path: Optional[str] = None) -> str:
    """A failing check's message: the report, where its dump was saved (ORACLE_DUMP_DIR) and where
    its HTML page was written (`html_path`, its folder made if missing)."""
    from oracle.report.table import headline

    where = save_failure(rep)
    text = f"{headline(rep.judgement)}\n{rep}" + (f"\nsaved the recording to {where}" if where else "")
    if html_path:
        os.makedirs(os.path.dirname(os.path.abspath(html_path)), exist_ok=True)
        rep.write_html(html_path, dump=where)
        text += f"\nHTML report: {html_path}"
    return text


def save_failure(rep: Report) -> Optional[str]:
    directory = os.environ.get(DUMP_DIR_ENV)
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    name = f"oracle-check-{rep.recording.spec.m}x{rep.recording.spec.n}x{rep.recording.spec.k}"
    path, i = os.path.join(directory, f"{name}.safetensors"), 1
    while os.path.exists(path):
        i += 1
        path = os.path.join(directory, f"{name}-{i}.safetensors")
    rec = rep.recording
    dataclasses.replace(rec, operands=rec.operands.to("cpu"), output=rec.output.cpu()).save(path)
    return path


def judge(recording: Recording) -> Report:
    """The differential on a recording (a dump, a live run, a model)."""
    from oracle.run.request import RunRequest

    return compare(RunRequest(recording=recording))


def load(path: str):
    """A recording from a dump file (safetensors, or its .gz): a GEMM Recording or an
    AttentionRecording, as the dump's problem kind says."""
    from oracle.run.dumps import load_recording

    return load_recording(path)


def run_live(case, inputs: str = "random:0", *, timeout_s: Optional[float] = None, repeat: Optional[int] = None,
             smem_poison: Optional[int] = None, sanitize: bool = False, time: bool = False,
             kernel: Optional[str] = None, entry: Optional[str] = None, untraced_entry: Optional[str] = None,
             trace_tiles=None, trace_k_blocks=None, trace_stages: Optional[str] = None, trace_groups=None,
             allow_library: bool = False,
             allow_outside_case_dir: bool = False, **overrides):
    """Build, run and trace a live case (a case TOML path, or an oracle.run.case_types.Case) and judge it;
    returns the Report (its `judgement` holds the races, the sanitizer's findings and the timings).
    Everything `python -m oracle compare CASE.toml` takes: `inputs` ones | index | ktag |
    random[:seed] | dump:PATH; `repeat` N traced and untraced runs compared bit for bit;
    `smem_poison` a 32-bit pattern; `sanitize` compute-sanitizer on the untraced build; `time` the
    kernel and its peers timed; the kernel's source, entry and untraced entry; the traced tiles
    ((tm, tn), ...), k-blocks, stages ("mma,epilogue_store") and groups (batch entries, at most 4); problem fields as keywords (a
    case file path only). A case file that names a launch library (host code) needs
    `allow_library=True`, one that names files outside its folder `allow_outside_case_dir=True`
    (oracle.run.case_files)."""
    from oracle.run.case_types import Case
    from oracle.run.request import RunRequest, resolve_case

    if isinstance(case, Case):
        if (overrides or kernel or entry or untraced_entry or trace_tiles or trace_k_blocks or trace_stages
                or trace_groups):
            raise SpecError("problem fields, the kernel and the trace selection apply to a case file path; a Case "
                            "object is run as it is")
    else:
        case = resolve_case(str(case), overrides, kernel=kernel, entry=entry, untraced_entry=untraced_entry,
                            trace_tiles=trace_tiles, trace_k_blocks=trace_k_blocks, trace_stages_text=trace_stages,
                            trace_groups=trace_groups,
                            allow_library=allow_library, allow_outside_case_dir=allow_outside_case_dir)
    return compare(RunRequest(case=case, inputs=inputs, repeat=repeat, smem_poison=smem_poison, sanitize=sanitize,
                              time=time, timeout_s=timeout_s))
