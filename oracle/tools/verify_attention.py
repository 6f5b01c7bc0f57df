"""Benchmark-and-verify an attention forward op: `python -m oracle verify --attention --op module:function`.

For every case it makes q, k, v with the oracle's random ladder and the case's seed
(oracle.run.attention_inputs), calls the op in the layout it takes, judges O (and LSE when the op
returns it) with `oracle.check_attention` (output only, per unit), and on a GPU times the op against
torch SDPA's flash backend (its math backend where flash refuses the case) under the oracle's timing
discipline (oracle.run.timing); without a GPU the timing is skipped with a note in the row. A sweep (TOML):

    kind = "attention"                 # tells `verify` this is an attention sweep

    [defaults]                         # applied to every case
    dtype = "bf16"                     # bf16 | fp16 (q, k, v and O)

    [[case]]
    name = "gqa-prefill"
    batch = 2
    heads_q = 8
    heads_kv = 2                       # must divide heads_q
    seqlen_q = 128
    seqlen_k = 128
    head_dim = 64
    causal = "top_left"                # none | top_left (SDPA's is_causal) | bottom_right (FlashAttention's)
    layout = "bhsd"                    # the op's tensors: bhsd [batch, heads, seq, dim] | bshd [batch, seq, heads, dim]
    call = "sdpa"                      # "sdpa": op(q, k, v, is_causal=) with enable_gqa=True for GQA where torch
                                       #   has it, else K and V repeated per query head;
                                       # "flash": op(q, k, v, causal=bool) returning o or (o, lse, ...)
    seed = 0

or `--shape B,HQ,HKV,LQ,LK,D` (repeatable) with --dtype, --causal, --layout, --call. A "sdpa" call has
no bottom-right alignment (is_causal is top-left): a bottom_right case with seqlen_q != seqlen_k needs
a "flash" call. Rows and exit codes are the GEMM verify's (oracle.tools.verify): 0 all MATCH, 1 a
divergence, 2 a broken case.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from oracle.run.case import read_toml
from oracle.run.case_types import CaseError
from oracle.tools.verify import finish_sweep, sweep_entries, write_page

KIND = "attention"
CASE_KEYS = ("name", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal",
             "layout", "call", "seed")
DTYPES = ("bf16", "fp16")
CAUSAL = ("none", "top_left", "bottom_right")
LAYOUTS = ("bshd", "bhsd")
CALLS = ("sdpa", "flash")
SHAPE_FIELDS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim")


def default_layout(call: str) -> str:
    """The layout a call convention's ops usually take: SDPA bhsd, FlashAttention bshd."""
    return "bhsd" if call == "sdpa" else "bshd"


@dataclass(frozen=True)
class AttentionVerifyCase:
    name: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str = "bf16"
    causal: str = "none"
    layout: Optional[str] = None  # None: the call's usual layout (default_layout)
    call: str = "sdpa"
    seed: int = 0

    def __post_init__(self) -> None:
        where = f"verify case {self.name!r}"
        for f in SHAPE_FIELDS:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CaseError(f"{where}: {f} = {v!r} must be a positive integer")
        if self.heads_q % self.heads_kv:
            raise CaseError(f"{where}: heads_kv = {self.heads_kv} must divide heads_q = {self.heads_q} "
                            f"(MHA: equal, GQA: a divisor, MQA: 1)")
        for f, allowed in (("dtype", DTYPES), ("causal", CAUSAL), ("call", CALLS)):
            if getattr(self, f) not in allowed:
                raise CaseError(f"{where}: {f} {getattr(self, f)!r} must be one of {', '.join(allowed)}")
        if self.layout is None:
            object.__setattr__(self, "layout", default_layout(self.call))
        if self.layout not in LAYOUTS:
            raise CaseError(f"{where}: layout {self.layout!r} must be one of {', '.join(LAYOUTS)} (bshd [batch, seq, "
                            f"heads, dim] as FlashAttention takes, bhsd [batch, heads, seq, dim] as SDPA takes)")
        if self.call == "sdpa" and self.causal == "bottom_right" and self.seqlen_q != self.seqlen_k:
            raise CaseError(f"{where}: a 'sdpa' call has no bottom-right causal (is_causal is top-left aligned) and "
                            f"seqlen_q {self.seqlen_q} != seqlen_k {self.seqlen_k}: use call 'flash' or causal "
                            f"'top_left'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise CaseError(f"{where}: seed = {self.seed!r} must be a non-negative integer")

    @property
    def shape(self) -> list[int]:
        return [getattr(self, f) for f in SHAPE_FIELDS]

    def spec(self):
        """The AttentionSpec of the case's inputs (oracle.problem.attention)."""
        from oracle.problem.attention import AttentionSpec

        return AttentionSpec(**{f: getattr(self, f) for f in SHAPE_FIELDS}, causal=self.causal, q_dtype=self.dtype,
                             k_dtype=self.dtype, v_dtype=self.dtype, o_dtype=self.dtype)


def sweep_kind(path: str) -> str:
    """"attention" for a sweep file with `kind = "attention"`, "gemm" for one without a kind."""
    kind = read_toml(path, "verify sweep").get("kind")
    if kind is None:
        return "gemm"
    if kind != KIND:
        raise CaseError(f"verify sweep {path!r}: kind = {kind!r} must be {KIND!r} (a GEMM sweep has no kind)")
    return KIND


def load_sweep(path: str) -> list[AttentionVerifyCase]:
    doc = read_toml(path, "verify sweep")
    if doc.get("kind", KIND) != KIND:
        raise CaseError(f"verify sweep {path!r}: kind = {doc['kind']!r}, not {KIND!r}: not an attention sweep")
    out = []
    for i, entry in enumerate(sweep_entries(path, CASE_KEYS, top=("kind", "defaults", "case"))):
        missing = [f for f in SHAPE_FIELDS if f not in entry]
        if missing:
            raise CaseError(f"verify sweep {path!r}: case #{i}: missing {', '.join(missing)}")
        out.append(AttentionVerifyCase(**entry))
    return out


def shape_cases(shapes: Sequence[str], dtype: str, causal: str, layout: Optional[str],
                call: str) -> list[AttentionVerifyCase]:
    out = []
    for s in shapes:
        parts = s.split(",")
        try:
            dims = [int(p) for p in parts]
        except ValueError:
            dims = []
        if len(dims) != len(SHAPE_FIELDS) or len(parts) != len(SHAPE_FIELDS):
            raise CaseError(f"--shape {s!r} must be B,HQ,HKV,LQ,LK,D (six positive integers: batch, query heads, KV "
                            f"heads, queries, keys, head dim)")
        name = f"{'x'.join(parts)}-{dtype}" + ("" if causal == "none" else f"-{causal}")
        out.append(AttentionVerifyCase(name, *dims, dtype=dtype, causal=causal, layout=layout, call=call))
    return out


def has_enable_gqa() -> bool:
    """Whether this torch's SDPA takes enable_gqa (torch >= 2.5)."""
    import torch

    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def gqa_mode(vc: AttentionVerifyCase) -> Optional[str]:
    """How a GQA case's K and V reach a 'sdpa' op: "enable_gqa" or "repeat_kv"; None without GQA or for 'flash'."""
    if vc.call != "sdpa" or vc.heads_q == vc.heads_kv:
        return None
    return "enable_gqa" if has_enable_gqa() else "repeat_kv"


def _call(op: Callable, vc: AttentionVerifyCase, q, k, v):
    """Call the op on bshd q, k, v in its layout; returns (o, lse) in bshd (lse None when not given)."""
    to_op = (lambda t: t.transpose(1, 2)) if vc.layout == "bhsd" else (lambda t: t)
    q, k, v = to_op(q), to_op(k), to_op(v)
    lse = None
    if vc.call == "sdpa":
        kw: dict[str, Any] = {"is_causal": vc.causal != "none"}
        mode = gqa_mode(vc)
        if mode == "enable_gqa":
            kw["enable_gqa"] = True
        elif mode == "repeat_kv":
            heads_dim = 1 if vc.layout == "bhsd" else 2
            rep = vc.heads_q // vc.heads_kv
            k, v = k.repeat_interleave(rep, dim=heads_dim), v.repeat_interleave(rep, dim=heads_dim)
        o = op(q, k, v, **kw)
    else:
        out = op(q, k, v, causal=vc.causal != "none")
        o, lse = (out[0], out[1]) if isinstance(out, (tuple, list)) else (out, None)
    if not hasattr(o, "transpose"):
        raise TypeError(f"the op returned {type(o).__name__}, not a tensor O")
    return to_op(o), lse


def run_case(op: Callable, vc: AttentionVerifyCase, html_page: Optional[str] = None, commands: Sequence = ()) -> dict:
    """Verify, then time, one case; a failure of the op or the case is a row, never a crash. With
    `html_page`, the judgement's HTML page is written there, with `commands` to re-run it."""
    import torch

    from oracle.run.attention_inputs import make_attention_operands
    from oracle.tools.api import check_attention

    row: dict[str, Any] = {"name": vc.name, "shape": vc.shape, "dtype": vc.dtype, "causal": vc.causal,
                           "layout": vc.layout, "call": vc.call, "gqa": gqa_mode(vc), "seed": vc.seed}
    t0 = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        ops = make_attention_operands(vc.spec(), "random", vc.seed)
        q, k, v = (t.to(dev) for t in (ops.q, ops.k, ops.v))
        o, lse = _call(op, vc, q, k, v)
        rep = check_attention(q, k, v, o, lse, causal=vc.causal, provenance=ops.provenance)
        write_page(row, rep, html_page, commands)
        row["verdict"] = rep.verdict
        first = rep.first_divergence
        if first is not None:
            row["first_divergence"] = {"stage": first.stage, "unit": list(first.tile) if first.tile else None,
                                       "element": list(first.element) if first.element else None,
                                       "kind": first.kind.value}
        w = next((s.chained.worst for s in rep.stages if s.name == "store" and s.chained.worst), None)
        row["worst_err_over_bound"] = w.max_ratio if w else None
        if dev != "cuda":
            from oracle.run.timing import NO_GPU

            row["timing"] = f"skipped: {NO_GPU}"
        elif rep.ok:
            row["performance"] = _time(op, vc, q, k, v)
        else:
            row["timing"] = "skipped: the output did not match"
    except Exception as e:  # a broken op or case is a row, not the end of the sweep
        row.update(verdict="ERROR", error=f"{type(e).__name__}: {e}")
    row["seconds"] = time.perf_counter() - t0
    return row


def _time(op, vc: AttentionVerifyCase, q, k, v) -> dict:
    from oracle.run.perf import attention_flops, sdpa_peer
    from oracle.run.timing import require_gpu, time_gpu, tflops

    require_gpu()
    spec = vc.spec()
    flops = attention_flops(spec)
    mine = time_gpu(lambda: _call(op, vc, q, k, v))
    peer_name, peer = sdpa_peer(spec, q, k, v)
    out = {"op_ms": mine.median_ms, "op_TFLOPs": tflops(flops, mine.median_ms), "op_rse": mine.rse}
    if peer is None:
        return {**out, "peer": None, "peer_note": "no SDPA backend ran the case"}
    return {**out, "peer": peer_name, "peer_ms": peer.median_ms, "peer_TFLOPs": tflops(flops, peer.median_ms),
            "op_speed_vs_peer": peer.median_ms / mine.median_ms, "peer_rse": peer.rse}


def run_verify(op_spec: str, cases: Sequence[AttentionVerifyCase], *, shard_text: Optional[str] = None,
               jsonl: Optional[str] = None, stream=None, html: Optional[str] = None,
               sweep_argv: Sequence[str] = ()) -> tuple[list[dict], int]:
    """Run the sweep (this shard of it) in this process; returns (rows, exit code: 0 all match,
    1 a divergence, 2 a broken case). `html`: a folder for every case's HTML page and an index.html
    linking them; `sweep_argv` the command line's words that name the sweep (for the pages)."""
    from oracle.tools.bench import environment, parse_shard
    from oracle.tools.verify import _progress, load_op, sweep_pages
    from oracle.tools.workers import device_of_this_process

    stream = sys.stderr if stream is None else stream  # the progress lines; read now, not at import
    op = load_op(op_spec)
    i, n = parse_shard(shard_text)
    indices = [j for j in range(len(cases)) if j % n == i]
    here = device_of_this_process()
    rows = []
    page, commands = sweep_pages(html, op_spec, sweep_argv)
    for j in indices:
        rows.append({"index": j, "kind": KIND, **run_case(op, cases[j], page(j, cases[j].name), commands), **here})
        _progress(len(rows), len(indices), rows[-1], stream)
    return rows, finish_sweep(rows, jsonl, environment() if jsonl else {}, op_spec, html,
                              f"verify --attention {op_spec}")


def table(rows: Sequence[dict]) -> str:
    from tabulate import tabulate

    out = []
    for r in rows:
        p, f = r.get("performance") or {}, r.get("first_divergence") or {}
        out.append([r["name"], ",".join(map(str, r["shape"])), r["dtype"], r["causal"], r["layout"],
                    r["call"] + (f" ({r['gqa']})" if r.get("gqa") else ""), r["verdict"],
                    f"{f['stage']} {tuple(f['unit']) if f.get('unit') else ''}".strip() if f else "-",
                    f"{r['worst_err_over_bound']:.3g}" if r.get("worst_err_over_bound") is not None else "-",
                    f"{p['op_ms']:.4g}" if p else "-", f"{p['peer_ms']:.4g}" if p.get("peer_ms") else "-",
                    f"{p['op_speed_vs_peer']:.3g}" if p.get("peer_ms") else "-"])
    text = tabulate(out, headers=["case", "B,HQ,HKV,LQ,LK,D", "dtype", "causal", "layout", "call", "verdict",
                                  "first divergence", "err/bound", "op ms", "peer ms", "speed vs peer"])
    notes = sorted({r["timing"] for r in rows if r.get("timing")})
    return text + "".join(f"\ntiming {n}" for n in notes)
