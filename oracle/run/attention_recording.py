"""A recorded attention run: the problem, Q, K, V (and the layout's offsets and page table), the
kernel's O and LSE, and the stage taps the kernel recorded (harness.taps' attention chain, read
from a trace sink of format version 3), with the trace's account (what the selection held and what
was lost). A recording without taps (oracle.check_attention) is judged at `store` only.

Taps name their site as docs/trace-format.md's "Attention sites" says: tile = (query block, query
head), k_block = the KV block, partial = the split (None when the problem is not split), group =
the batch entry. `recording_of_model` makes one from oracle.run.attention_model's sink.

A recording saves and loads as a dump (harness.dump, as a GEMM recording does): inputs q, k, v and,
where the layout has them, cu_seqlens_q, cu_seqlens_k, page_table; outputs o and lse; every tap
with its site; the document's problem is the AttentionSpec (kind "attention"), checked against the
header's tensors before any data is read. oracle.run.dumps.load_recording reads either kind.

Shapes are FlashAttention's (kernels_ref.attention.geometry): dense q [batch, seqlen_q, heads_q,
head_dim], k / v [batch, seqlen_k, heads_kv, dim], o like q with head_dim_v, lse [batch, heads_q,
seqlen_q] fp32; varlen q / o [total_q, heads, dim] with cu_seqlens_q [batch + 1] and lse [heads_q,
total_q] (k / v likewise with cu_seqlens_k); paged k / v [num_pages, page_size, heads_kv, dim] with
page_table [batch, max_pages] int32 (key counts from cu_seqlens_k, else the problem's seqlen_k).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import torch

from harness.dump import Dump, DumpError, load_dump, save_dump
from harness.fields import shown
from harness.taps import ALL_TAP_STAGES, ATTENTION_KV_STAGES, ATTENTION_TAP_STAGES, Tap
from harness.trace_format import TraceAccount, account_of
from kernels_ref.dtypes import DTYPES, name_of
from oracle.problem.attention import AttentionSpec
from oracle.run.attention_model import AttentionModelRun, PagedKV, run_attention_model
from oracle.run.confounds import Confound
from oracle.run.inputs import ATTENTION_LADDER, Provenance
from oracle.run.recording import RecordingError, _Meta, common_meta, problem_kind

INPUTS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "page_table")  # a dump's input.<name>
OUTPUTS = ("o", "lse")  # its output.<name>
_INDEX_TYPES = (torch.int32, torch.int64)

_F32_STAGES = ("s", "mask", "softmax_state", "o", "normalize", "combine")


@dataclass(frozen=True)
class AttentionRecording:
    spec: AttentionSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    output: Optional[torch.Tensor]  # O; None when the kernel never finished
    provenance: Provenance
    lse: Optional[torch.Tensor] = None
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_k: Optional[torch.Tensor] = None
    page_table: Optional[torch.Tensor] = None
    kernel: str = "unknown"
    kernel_error: Optional[str] = None
    synthetic: bool = False
    confounds: tuple[Confound, ...] = ()  # oracle.run.confounds
    notes: tuple[str, ...] = ()
    environment: Mapping[str, Any] = field(default_factory=dict)
    taps: tuple[Tap, ...] = ()  # the attention stages' taps (module docstring: their sites)
    trace: Optional[TraceAccount] = None  # the trace's selection and what it lost; None: no trace
    command: tuple[str, ...] = ()  # the command line that made the run
    serialised: tuple[str, ...] = ()  # what the traced build serialises that the production build does not
    guard_breaches: tuple = ()  # harness.guard_bands.GuardBreach: bytes written outside O, LSE or a workspace

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape each tensor must have for the spec."""
        return shapes_of(self.spec)

    def validate(self) -> None:
        """Raise RecordingError naming the tensor that does not fit the problem."""
        s = self.spec
        _check_types(s, {name: (t.dtype, tuple(t.shape)) for name, t in self.tensors().items()})
        if self.output is None and self.kernel_error is None:
            raise RecordingError("the recording has no output O and no kernel error")
        if s.lse and self.output is not None and self.lse is None:
            raise RecordingError("the problem says the kernel writes LSE (lse = true) but no LSE was given")
        for name, cu, lengths, on in (("cu_seqlens_q", self.cu_seqlens_q, s.lengths_q, s.varlen_q),
                                      ("cu_seqlens_k", self.cu_seqlens_k, s.lengths_k, s.varlen_k)):
            if on and cu is None:
                raise RecordingError(f"{name} is missing: the problem has variable lengths")
            if cu is not None:
                got = cu.detach().cpu().to(torch.int64)
                if got.dim() != 1 or got.numel() != s.batch + 1 or int(got[0]) != 0 or \
                        tuple((got[1:] - got[:-1]).tolist()) != tuple(lengths):
                    raise RecordingError(f"{name} = {got.tolist()[:8]} does not hold the lengths {list(lengths)[:8]}")
        if s.paged:
            pt = self.page_table
            if pt is None or tuple(pt.shape) != (s.batch, s.max_pages) or pt.dtype not in (torch.int32, torch.int64):
                raise RecordingError(f"page_table must be [{s.batch}, {s.max_pages}] int32 for a paged cache, got "
                                     f"{None if pt is None else (pt.dtype, list(pt.shape))}")
            used = [pt[b, :-(-n // s.page_size)] for b, n in enumerate(s.lengths_k)]
            flat = torch.cat(used) if used else pt.new_zeros(0)
            if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= s.num_pages):
                raise RecordingError(f"page_table names pages outside 0..{s.num_pages - 1}")
        elif self.page_table is not None:
            raise RecordingError("a page_table was given but the problem has no paged KV cache (page_size)")
        for tap in self.taps:
            self._check_tap(tap)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The recording's tensors by their dump names (INPUTS, OUTPUTS), those it has."""
        named = {"q": self.q, "k": self.k, "v": self.v, "cu_seqlens_q": self.cu_seqlens_q,
                 "cu_seqlens_k": self.cu_seqlens_k, "page_table": self.page_table, "o": self.output, "lse": self.lse}
        return {name: t for name, t in named.items() if t is not None}

    # -- persistence -------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write the recording as a dump (harness.dump.save_dump: atomically, never through a link)."""
        named = self.tensors()
        save_dump(path, Dump(inputs={n: named[n] for n in INPUTS if n in named},
                             outputs={n: named[n] for n in OUTPUTS if n in named}, taps=self.taps,
                             meta=common_meta(self)))

    @classmethod
    def load(cls, path: str) -> "AttentionRecording":
        """Read an attention dump written by `save`: the header and the document first (the problem
        against every tensor's dtype and shape), then the data, then the whole recording against its
        problem (validate). Raises DumpError naming the problem, nothing else."""
        dump = load_dump(path, lambda meta, inputs, outputs: check_attention_header(path, meta, inputs, outputs),
                         stages=ALL_TAP_STAGES)  # the kind is checked first; validate refuses a GEMM's taps
        return cls.of_dump(path, dump)

    @classmethod
    def of_dump(cls, path: str, dump: Dump) -> "AttentionRecording":
        """The recording a loaded dump holds (its header already checked by check_attention_header)."""
        m = _meta_of(path, dump.meta)
        _check_names(path, dump.inputs, dump.outputs)
        if dump.descriptors:
            raise DumpError(f"dump {path!r}: an attention recording has no TMA descriptor records")
        t = dict(dump.inputs, **dump.outputs)
        rec = cls(spec=m.spec, q=t["q"], k=t["k"], v=t["v"], output=t.get("o"), provenance=m.provenance_of(path),
                  lse=t.get("lse"), cu_seqlens_q=t.get("cu_seqlens_q"), cu_seqlens_k=t.get("cu_seqlens_k"),
                  page_table=t.get("page_table"), kernel=m.kernel.get("name", "unknown"),
                  kernel_error=m.kernel.get("error"), synthetic=m.synthetic, confounds=m.confounds, notes=m.notes,
                  environment=m.environment, taps=dump.taps, trace=m.trace, command=m.command,
                  serialised=m.serialised)
        try:
            rec.validate()
        except RecordingError as e:
            raise DumpError(f"dump {path!r} is inconsistent: {e}") from None
        return rec

    def tap_shape(self, stage: str) -> tuple[int, int]:
        """The [rows, cols] a tap of `stage` holds (harness.taps' attention table)."""
        s = self.spec
        return {"load_q": (s.block_q, s.head_dim), "load_k": (s.block_kv, s.head_dim),
                "load_v": (s.block_kv, s.head_dim_v), "s": (s.block_q, s.block_kv), "mask": (s.block_q, s.block_kv),
                "softmax_state": (s.block_q, 3), "p": (s.block_q, s.block_kv), "o": (s.block_q, s.head_dim_v),
                "normalize": (s.block_q, s.head_dim_v + 1), "combine": (s.block_q, s.head_dim_v + 1)}[stage]

    def _check_tap(self, tap: Tap) -> None:
        """Raise RecordingError naming a tap whose site or values do not fit the problem."""
        s = self.spec
        if not isinstance(tap, Tap) or tap.stage not in ATTENTION_TAP_STAGES:
            raise RecordingError(f"{getattr(tap, 'stage', tap)!r}: an attention recording holds only taps of "
                                 f"{', '.join(ATTENTION_TAP_STAGES)}")
        qb, h = tap.tile
        where = tap.describe()
        if tap.group is None or tap.group >= s.batch:
            raise RecordingError(f"{where}: group must name the batch entry 0..{s.batch - 1}, got {tap.group}")
        if qb >= s.q_blocks or h >= s.heads_q:
            raise RecordingError(f"{where}: tile (query block {qb}, head {h}) is outside {s.q_blocks} query blocks x "
                                 f"{s.heads_q} heads")
        if tap.stage in ATTENTION_KV_STAGES:
            if tap.k_block >= s.kv_blocks:
                raise RecordingError(f"{where}: KV block {tap.k_block} is outside 0..{s.kv_blocks - 1}")
        elif tap.k_block is not None:
            raise RecordingError(f"{where}: a {tap.stage} tap belongs to no KV block")
        if tap.stage == "combine" or s.splits == 1:
            if tap.partial is not None:
                raise RecordingError(f"{where}: names split {tap.partial}, but " +
                                     ("combine merges every split" if tap.stage == "combine" else
                                      "the problem is not split (splits = 1)"))
        elif tap.partial is None or tap.partial >= s.splits:
            raise RecordingError(f"{where}: a split problem's tap must name its split 0..{s.splits - 1}")
        if tap.stage == "combine" and s.splits == 1:
            raise RecordingError(f"{where}: the problem is not split, so it has no combine stage")
        want = self.tap_shape(tap.stage)
        if tuple(tap.values.shape) != want:
            raise RecordingError(f"{where}: values have shape {list(tap.values.shape)}, the problem's tap holds "
                                 f"{list(want)}")
        if tap.stage.startswith("load_"):  # the operand's own elements, compared bit for bit
            dt = getattr(s, f"{tap.stage[-1]}_dtype")
            if tap.values.dtype != DTYPES[dt].torch:
                raise RecordingError(f"{where}: values are {tap.values.dtype}, but a load tap holds the operand's own "
                                     f"elements: {tap.stage[-1]}_dtype is {dt}")
        elif tap.stage in _F32_STAGES and tap.values.dtype != torch.float32:
            raise RecordingError(f"{where}: values are {tap.values.dtype}, a {tap.stage} tap holds fp32")


def shapes_of(s: AttentionSpec) -> dict[str, tuple[int, ...]]:
    """The shape each of q, k, v, o, lse must have for the problem (module docstring)."""
    tq = sum(s.lengths_q)
    q = (tq, s.heads_q, s.head_dim) if s.varlen_q else (s.batch, s.seqlen_q, s.heads_q, s.head_dim)
    o = q[:-1] + (s.head_dim_v,)
    if s.paged:
        k = (s.num_pages, s.page_size, s.heads_kv)
    elif s.varlen_k:
        k = (sum(s.lengths_k), s.heads_kv)
    else:
        k = (s.batch, s.seqlen_k, s.heads_kv)
    lse = (s.heads_q, tq) if s.varlen_q else (s.batch, s.heads_q, s.seqlen_q)
    return {"q": q, "k": k + (s.head_dim,), "v": k + (s.head_dim_v,), "o": o, "lse": lse}



def _check_types(s: AttentionSpec, entries: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> None:
    """Each tensor's dtype and shape (by dump name) against the problem: RecordingError naming it."""
    want = shapes_of(s)
    for name, dt in (("q", s.q_dtype), ("k", s.k_dtype), ("v", s.v_dtype), ("o", s.o_dtype), ("lse", "fp32")):
        if name not in entries:
            continue
        dtype, shape = entries[name]
        if tuple(shape) != want[name]:
            raise RecordingError(f"{name} has shape {list(shape)}, {s.describe()} needs {list(want[name])}")
        if dtype != DTYPES[dt].torch:
            raise RecordingError(f"{name} has dtype {dtype}, the problem's is {dt} ({DTYPES[dt].torch})")
    for name, rows in (("cu_seqlens_q", (s.batch + 1,)), ("cu_seqlens_k", (s.batch + 1,)),
                       ("page_table", (s.batch, s.max_pages))):
        if name in entries:
            dtype, shape = entries[name]
            if dtype not in _INDEX_TYPES or (name != "page_table" or s.paged) and tuple(shape) != rows:
                raise RecordingError(f"{name} is {dtype} {list(shape)}, the problem's is int32 or int64 "
                                     f"{list(rows) if name != 'page_table' or s.paged else '(none: not paged)'}")


def _meta_of(path: str, meta: Mapping[str, Any]) -> _Meta:
    """An attention dump's metadata, every field checked (oracle.run.recording's checks, with an
    AttentionSpec for the problem)."""
    where = f"dump {path!r}"
    if problem_kind(meta, where) != "attention":
        raise DumpError(f"{where}: the problem's kind is not 'attention' (a GEMM dump: read it with "
                        f"oracle.run.dumps.load_recording)")
    m = _Meta.of(meta, where, problem=AttentionSpec, ladders=ATTENTION_LADDER + ("dump", "captured"))
    if m.output_poison is not None:
        raise DumpError(f"{where}: metadata field output_poison={m.output_poison} is not allowed: an attention "
                        f"recording records none (null)")
    return m


def _check_names(path: str, inputs, outputs) -> None:
    for kind, names, known in (("input", inputs, INPUTS), ("output", outputs, OUTPUTS)):
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise DumpError(f"dump {path!r}: unknown {kind} tensor(s) {shown(unknown)}; an attention dump's are "
                            f"{', '.join(known)}")
    missing = [n for n in ("q", "k", "v") if n not in inputs]
    if missing:
        raise DumpError(f"dump {path!r}: Q, K and V are required (input.q, input.k, input.v); missing "
                        f"{', '.join(missing)}")


def check_attention_header(path: str, meta, inputs: dict, outputs: dict) -> None:
    """An attention dump's document against the tensors its header lists (dtype and shape), before
    any data is read: a header the problem does not account for is refused without reading it."""
    m = _meta_of(path, meta)
    _check_names(path, inputs, outputs)
    try:
        _check_types(m.spec, dict(inputs, **outputs))
    except RecordingError as e:
        raise DumpError(f"dump {path!r} is inconsistent: {e}") from None


def recording_of_model(run: AttentionModelRun, q: torch.Tensor, k: Optional[torch.Tensor],
                       v: Optional[torch.Tensor], provenance: Provenance, *, causal: str = "none",
                       softmax_scale: Optional[float] = None, softcap: float = 0.0,
                       paged: Optional[PagedKV] = None, kernel: Optional[str] = None) -> AttentionRecording:
    """The recording of one run of oracle.run.attention_model on these inputs (given as the model
    took them, with the same causal, softmax_scale, softcap and paged): its problem, its O and LSE,
    and its taps parsed from the sink, with the trace's account. The model writes +inf as a fully
    masked row's LSE (FlashAttention-2's convention: empty_lse "+inf") and O in q's type; a paged
    cache's key count is recorded as seqlens_k with its cu_seqlens_k."""
    batch, seqlen_q, heads_q, head_dim = (int(x) for x in q.shape)
    kk = k if paged is None else paged.k_cache
    vv = v if paged is None else paged.v_cache
    names = [name_of(t.dtype) for t in (q, kk, vv)]
    extra: dict[str, Any] = {}
    cu_k = page_table = None
    if paged is None:
        seqlen_k = int(k.shape[1])
    else:
        seqlen_k = paged.seqlen_k
        page_table = paged.page_table.to(torch.int32)
        extra = dict(page_size=paged.page_size, num_pages=int(paged.k_cache.shape[0]),
                     max_pages=int(page_table.shape[1]), seqlens_k=(seqlen_k,) * batch)
        cu_k = torch.arange(batch + 1, dtype=torch.int32) * seqlen_k
    spec = AttentionSpec(batch=batch, heads_q=heads_q, heads_kv=int(kk.shape[2]), seqlen_q=seqlen_q,
                         seqlen_k=seqlen_k, head_dim=head_dim, head_dim_v=run.head_dim_v, causal=causal,
                         softmax_scale=softmax_scale, softcap=softcap, q_dtype=names[0], k_dtype=names[1],
                         v_dtype=names[2], o_dtype=names[0], block_q=run.block_q, block_kv=run.block_kv,
                         splits=run.splits, empty_lse="+inf", **extra)
    notes = tuple(run.trace.warnings)
    name = kernel or ("attention model" + (f" with {run.injection.value}" if run.injection else ""))
    rec = AttentionRecording(spec=spec, q=q, k=kk, v=vv, output=run.out, provenance=provenance, lse=run.lse,
                             cu_seqlens_k=cu_k, page_table=page_table, kernel=name, synthetic=True, notes=notes,
                             taps=tuple(run.trace.taps), trace=account_of(run.trace))
    rec.validate()
    return rec


def model_recording(q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], provenance: Provenance,
                    **model_args) -> AttentionRecording:
    """Run oracle.run.attention_model (its keyword arguments) and record the run."""
    run = run_attention_model(q, k, v, **model_args)
    keep = {n: model_args[n] for n in ("causal", "softmax_scale", "softcap", "paged") if n in model_args}
    return recording_of_model(run, q, k, v, provenance, **keep)
