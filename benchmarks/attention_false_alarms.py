"""False alarms of the attention check: correct attention outputs from real kernels, judged output-only.

On the H200 (one GPU; about 300+ cases):
    python benchmarks/attention_false_alarms.py --out-dir $OUT
On the CPU (a smoke test: the math and CPU flash backends, small shapes):
    python benchmarks/attention_false_alarms.py --cpu --cases 6 --out-dir /tmp/x

Every case is one attention forward computed by a backend: torch's scaled_dot_product_attention
with the flash, memory-efficient and math backends (torch.nn.attention.sdpa_kernel), and
flash_attn.flash_attn_func / flash_attn_varlen_func when flash_attn imports. Cases are drawn from
a seeded generator: bf16 / fp16; MHA, GQA and MQA; no mask, top-left causal (SDPA's is_causal),
bottom-right causal and sliding windows (explicit boolean masks; flash_attn's own causal and
window_size), fully masked rows (bottom-right with seqlen_q > seqlen_k); ragged lengths (SDPA run
per sequence and packed; flash_attn's varlen API); head_dim 64 / 128; key counts up to 32768. A
backend that refuses a case (a mask it does not take, a layout) counts it as skipped, with the
reason, never judged. Each output is judged by oracle.check_attention (FlashAttention's layout;
SDPA's tensors transposed); a correct case that is not MATCH is a false alarm (false_diverged
counts DIVERGED). LSE is judged where the backend returns it (flash_attn); SDPA's is not.
Then defects are planted in the first correct cases' outputs, one at a time: one row's NaN, one
unit's rows times 1.05, one element's sign flipped; detected means DIVERGED, right unit means the
first divergence names the planted unit.

Writes results/attention_false_alarms_<machine>.json (under --out-dir, default benchmarks/) with the
machine, versions, seed, per-backend counts (cases, match, false_diverged, other, skipped), the
worst err/bound of a correct case, the false alarms' cases and the planted table; prints a
summary. Exit 0 when false_diverged is 0, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import oracle  # noqa: E402
from benchmarks import provenance  # noqa: E402
from kernels_ref.attention.geometry import AttnParams, allowed_host  # noqa: E402

BACKENDS = ("sdpa_flash", "sdpa_efficient", "sdpa_math", "flash_attn")
DEFECTS = ("nan_row", "unit_x1.05", "sign_flip")


@dataclass(frozen=True)
class Case:
    backend: str
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    lq: tuple[int, ...]  # per sequence
    lk: tuple[int, ...]
    head_dim: int
    mask: str  # none | top_left | bottom_right | window
    window: tuple[int, int] = (-1, -1)
    seed: int = 0

    @property
    def ragged(self) -> bool:
        return len(set(self.lq)) > 1 or len(set(self.lk)) > 1


def make_cases(n: int, seed: int, backends, cpu: bool) -> list[Case]:
    rng = random.Random(seed)
    long = (4096,) if cpu else (8192, 32768)
    out = []
    for i in range(n):
        be = backends[i % len(backends)]
        dt = rng.choice(("bf16", "fp16"))
        hk = rng.choice((1, 2, 4)) if not cpu else rng.choice((1, 2))
        hq = hk * rng.choice((1, 2, 4))
        d = rng.choice((64, 128)) if not cpu else 32
        # torch's flash backend takes no boolean mask: its cases draw the masks it takes natively
        flash = be == "sdpa_flash" and not cpu
        mask = rng.choice(("none", "top_left", "bottom_right") if flash else
                          ("none", "top_left", "bottom_right", "window", "masked_rows"))
        b = rng.choice((1, 2, 3))
        if cpu:
            lq = [rng.randint(1, 40) for _ in range(b)]
            lk = [rng.randint(1, 70) for _ in range(b)]
        elif rng.random() < 0.12:  # a long context: decode-like or a prefill chunk against 8k-32k keys
            b = 1
            lk = [rng.choice(long)]
            lq = [rng.choice((1, 16, 128, 1024))]
        else:
            lq = [rng.randint(1, 1536) for _ in range(b)]
            lk = [rng.randint(1, 3072) for _ in range(b)]
        if rng.random() < 0.5:  # one length for every sequence
            lq, lk = [lq[0]] * b, [lk[0]] * b
        if flash and mask != "none":  # causal within its native form: no query row past the keys
            lq = [min(x, y) for x, y in zip(lq, lk)]
        if mask == "masked_rows":
            lq = [max(x, y + 3) for x, y in zip(lq, lk)]
            mask = "bottom_right"
        window = (rng.randint(0, 256), rng.choice((0, 0, 32))) if mask == "window" else (-1, -1)
        out.append(Case(be, dt, b, hq, hk, tuple(lq), tuple(lk), d, mask, window, seed * 100003 + i))
    return out


class Skipped(Exception):
    pass


def _keep(c: Case, n_q: int, n_k: int) -> torch.Tensor:
    causal = {"none": "none", "window": "none"}.get(c.mask, c.mask)
    return allowed_host(torch.arange(n_q), torch.arange(n_k), n_q, n_k,
                        AttnParams(scale=1.0, causal=causal, window=c.window))


def _sdpa(c: Case, q, k, v, dev):
    """O per sequence ([L, H, Dv], FlashAttention's layout) from one SDPA backend. Each mask goes in
    the form the backend takes: top-left causal as is_causal, bottom-right as torch's
    causal_lower_right bias (flash and memory-efficient take it natively), anything else as a boolean
    mask; grouped K/V heads through enable_gqa, or repeated per query head for the memory-efficient
    backend, which refuses enable_gqa."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    be = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
          "sdpa_math": SDPBackend.MATH}[c.backend]
    outs = []
    for qs, ks, vs in zip(q, k, v):
        qq, kk, vv = (t.transpose(0, 1).unsqueeze(0) for t in (qs, ks, vs))
        kw = {}
        if c.heads_q != c.heads_kv:
            if c.backend == "sdpa_efficient":
                g = c.heads_q // c.heads_kv
                kk, vv = kk.repeat_interleave(g, dim=1), vv.repeat_interleave(g, dim=1)
            else:
                kw["enable_gqa"] = True
        if c.mask == "top_left" and qs.shape[0] <= ks.shape[0]:
            kw["is_causal"] = True
        elif c.mask == "bottom_right" and c.backend != "sdpa_math" and qs.shape[0] <= ks.shape[0]:
            kw["attn_mask"] = causal_lower_right(qs.shape[0], ks.shape[0])
        elif c.mask == "bottom_right" and c.backend == "sdpa_flash":  # rows with no key: a boolean mask only
            raise Skipped("fully masked rows: torch's causal_lower_right gives NaN rows when seq_len_q > "
                          "seq_len_kv (its documented behaviour), and the flash backend takes no boolean mask")
        elif c.mask != "none":
            kw["attn_mask"] = _keep(c, qs.shape[0], ks.shape[0]).to(dev)
        try:
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(qq, kk, vv, **kw)
        except RuntimeError as e:
            raise Skipped(str(e).splitlines()[0][:160]) from None
        outs.append(o[0].transpose(0, 1))
    return outs, None


def _flash_attn(c: Case, q, k, v, dev):
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as e:
        raise Skipped(f"flash_attn does not import: {e}") from None
    cu = (lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0)), dtype=torch.int32, device=dev))
    window = c.window if c.mask == "window" else (-1, -1)
    if c.mask == "top_left":
        raise Skipped("flash_attn's causal is bottom-right aligned only")
    o, lse, _ = flash_attn_varlen_func(torch.cat(q), torch.cat(k), torch.cat(v), cu(c.lq), cu(c.lk), max(c.lq),
                                       max(c.lk), causal=c.mask == "bottom_right", window_size=window,
                                       return_attn_probs=True)
    return o, lse


def _imports(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _case_line(r: dict) -> dict:
    """One case in the results file: its shape, what came of it, and where its time went."""
    c = r["case"]
    line = {k: c[k] for k in ("backend", "dtype", "batch", "heads_q", "heads_kv", "head_dim", "mask", "seed")}
    line.update(lq=sum(c["lq"]), lk_max=max(c["lk"]), status=r["status"])
    for k in ("engine_s", "judge_s", "ratio"):
        if r.get(k) is not None:
            line[k] = round(r[k], 4)
    return line


def machine_name() -> str:
    """The GPU's short name ("h100", "h200", ...) from its device name, as results files are named."""
    import re

    name = torch.cuda.get_device_name(0)
    m = re.search(r"\b([A-Z]\d{2,4})\b", name)
    return m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def run_case(c: Case, dev: str) -> dict:
    """One case: its output judged; the record of what happened."""
    g = torch.Generator(device="cpu").manual_seed(c.seed)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[c.dtype]
    q = [torch.randn(n, c.heads_q, c.head_dim, generator=g).to(dev, dt) for n in c.lq]
    k = [torch.randn(n, c.heads_kv, c.head_dim, generator=g).to(dev, dt) for n in c.lk]
    v = [torch.randn(n, c.heads_kv, c.head_dim, generator=g).to(dev, dt) for n in c.lk]
    t_engine = time.perf_counter()
    try:
        o, lse = (_flash_attn if c.backend == "flash_attn" else _sdpa)(c, q, k, v, dev)
    except Skipped as e:
        return {"case": asdict(c), "status": "skipped", "why": str(e)}
    if dev == "cuda":
        torch.cuda.synchronize()
    engine_s = time.perf_counter() - t_engine
    causal = {"top_left": "top_left", "bottom_right": "bottom_right"}.get(c.mask, "none")
    kw = dict(causal=causal, window=c.window if c.mask == "window" else None)
    if c.backend == "flash_attn":
        kw["empty_lse"] = "+inf"  # FlashAttention-2 writes +inf for a fully masked row
    cu = (lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0)), dtype=torch.int32))
    o_cat = o if isinstance(o, torch.Tensor) else torch.cat(o)
    t0 = time.perf_counter()
    rep = oracle.check_attention(torch.cat(q), torch.cat(k), torch.cat(v), o_cat, lse, cu_seqlens_q=cu(c.lq),
                                 cu_seqlens_k=cu(c.lk), **kw)
    worst = rep.stages[-1].chained.worst
    return {"case": asdict(c), "status": rep.verdict, "engine_s": engine_s, "judge_s": time.perf_counter() - t0,
            "ratio": None if worst is None else float(worst.max_ratio), "summary": rep.to_json()["summary"][:400],
            "_inputs": (q, k, v, o_cat, lse, kw)}


def plant(rec: dict, defect: str) -> dict:
    """One defect in a correct case's output; detected and named at the right unit?"""
    c = Case(**{**rec["case"], "lq": tuple(rec["case"]["lq"]), "lk": tuple(rec["case"]["lk"]),
                "window": tuple(rec["case"]["window"])})
    q, k, v, o, lse, kw = rec["_inputs"]
    o = o.clone()
    b = max(range(c.batch), key=lambda i: c.lq[i])  # the longest sequence
    row0 = sum(c.lq[:b])
    i = c.lq[b] - 1
    h = c.heads_q - 1
    if defect == "nan_row":
        o[row0 + i, h] = float("nan")
    elif defect == "unit_x1.05":
        blk = (i // 64) * 64
        o[row0 + blk:row0 + i + 1, h] *= 1.05
    else:
        j = int(o[row0 + i, h].float().abs().argmax())
        o[row0 + i, h, j] = -o[row0 + i, h, j]
    cu = (lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0)), dtype=torch.int32))
    rep = oracle.check_attention(torch.cat(q), torch.cat(k), torch.cat(v), o, lse, cu_seqlens_q=cu(c.lq),
                                 cu_seqlens_k=cu(c.lk), **kw)
    f = rep.first_divergence
    unit = (b * c.heads_q + h, i // 64)
    return {"defect": defect, "backend": c.backend, "detected": rep.verdict == "DIVERGED",
            "right_unit": f is not None and tuple(f.tile) == unit}


def environment(dev: str) -> dict:
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    try:
        import flash_attn
        fav = flash_attn.__version__
    except ImportError:
        fav = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": tv, "flash_attn": fav,
            "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else None, "platform": platform.platform(),
            "node": platform.node()}


def _part(text: Optional[str]) -> tuple[int, int]:
    if text is None:
        return 0, 1
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise SystemExit(f"--part wants K/N with 0 <= K < N (got {text!r})")
    return int(k), int(n)


def merge_parts(files: list[str], out_dir: str) -> int:
    """The parts of one run (the same seed, cases and machine, every part once) summed into its results file."""
    docs = []
    for f in files:
        with open(f) as fh:
            docs.append(json.load(fh))
    first = docs[0]
    for d in docs:
        for key in ("schema", "machine", "seed", "cases_made"):
            if d.get(key) != first.get(key):
                raise SystemExit(f"{key} differs between the parts: {d.get(key)!r} and {first.get(key)!r}")
    n = first["part"][1]
    if sorted(d["part"][0] for d in docs) != list(range(n)) or any(d["part"][1] != n for d in docs):
        raise SystemExit(f"the parts given are {[d['part'] for d in docs]}: every part of {n} is needed once")
    per: dict = {}
    for d in docs:
        for be, p in d["per_backend"].items():
            acc = per.setdefault(be, dict.fromkeys(p, 0))
            for k, v in p.items():
                acc[k] += v
    ratios = [d["worst_ratio"] for d in docs if d["worst_ratio"] is not None]
    planted = [p for d in docs for p in d["planted"]]
    doc = {"schema": first["schema"], "machine": first["machine"], "environment": first["environment"],
           "seed": first["seed"], "cases_made": first["cases_made"], "part": [0, 1],
           "cases_in_part": sum(d["cases_in_part"] for d in docs), "cases_run": sum(d["cases_run"] for d in docs),
           "false_diverged": sum(d["false_diverged"] for d in docs), "per_backend": per,
           "worst_ratio": max(ratios) if ratios else None,
           "false_alarms": [a for d in docs for a in d["false_alarms"]],
           "skipped": [s for d in docs for s in d["skipped"]][:50], "cases": [c for d in docs for c in d["cases"]],
           "planted": planted, "planted_detected": sum(p["detected"] for p in planted),
           "planted_right_unit": sum(p["right_unit"] for p in planted),
           "seconds": sum(d["seconds"] for d in docs), "merged_from": [os.path.basename(f) for f in files],
           provenance.KEY: first[provenance.KEY]}
    path = os.path.join(out_dir, "results", f"attention_false_alarms_{first['machine']}.json")
    from harness.output_files import write_text_atomically

    write_text_atomically(path, json.dumps(doc, indent=2, default=str) + "\n", "attention false-alarm JSON")
    print(f"{doc['cases_run']} of {doc['cases_made']} cases in {len(docs)} parts; false DIVERGED: "
          f"{doc['false_diverged']}; wrote {path}")
    return 0 if doc["false_diverged"] == 0 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (SDPA math and flash; small shapes)")
    ap.add_argument("--cases", type=int, default=None, help="how many cases (default 360, --cpu 12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--machine", default=None, help="the name in the output file (default: the GPU's, e.g. h100 or "
                    "h200, or cpu)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks"))
    ap.add_argument("--planted", type=int, default=None, help="correct cases to plant defects in (default 6)")
    ap.add_argument("--budget-s", type=float, default=1500.0, help="no new case after this many seconds")
    ap.add_argument("--verbose", action="store_true", help="print a line per case as it is judged")
    ap.add_argument("--part", default=None, help="K/N: only the cases whose index is K modulo N (a run spread over "
                    "several calls); the file is named ..._partK-of-N.json")
    ap.add_argument("--merge", nargs="+", default=None, help="part files of one run: write their sum as the run's "
                    "results file and stop")
    args = ap.parse_args(argv)
    if args.merge:
        return merge_parts(args.merge, args.out_dir)
    dev = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    machine = args.machine or ("cpu" if dev == "cpu" else machine_name())
    backends = ("sdpa_flash", "sdpa_math") if dev == "cpu" else BACKENDS
    if "flash_attn" in backends and not _imports("flash_attn"):  # said once, in environment, not per case
        backends = tuple(b for b in backends if b != "flash_attn")
    cases = make_cases(args.cases or (12 if dev == "cpu" else 360), args.seed, backends, dev == "cpu")
    part, parts = _part(args.part)
    made = len(cases)
    cases = cases[part::parts]
    t0 = time.perf_counter()
    records = []
    for c in cases:
        if time.perf_counter() - t0 > args.budget_s:
            break
        records.append(run_case(c, dev))
        if args.verbose:
            line = _case_line(records[-1])
            print(" ".join(f"{k}={v}" for k, v in line.items()), flush=True)
    per = {be: {"cases": 0, "match": 0, "false_diverged": 0, "other": 0, "skipped": 0} for be in backends}
    for r in records:
        p = per[r["case"]["backend"]]
        if r["status"] == "skipped":
            p["skipped"] += 1
            continue
        p["cases"] += 1
        key = {"MATCH": "match", "DIVERGED": "false_diverged"}.get(r["status"], "other")
        p[key] += 1
    correct = [r for r in records if r["status"] == "MATCH"]
    planted = [plant(r, d) for r in correct[:args.planted if args.planted is not None else 6] for d in DEFECTS]
    false = [r for r in records if r["status"] not in ("MATCH", "skipped")]
    ratios = [r["ratio"] for r in correct if r["ratio"] is not None]
    doc = {"schema": "attention_false_alarms/1", "machine": machine, "environment": environment(dev),
           "seed": args.seed, "cases_made": made, "part": [part, parts], "cases_in_part": len(cases),
           "cases_run": len(records),
           "false_diverged": sum(p["false_diverged"] for p in per.values()), "per_backend": per,
           "worst_ratio": max(ratios) if ratios else None,
           "false_alarms": [{k: v for k, v in r.items() if not k.startswith("_")} for r in false],
           "skipped": [{"case": r["case"], "why": r["why"]} for r in records if r["status"] == "skipped"][:50],
           "cases": [_case_line(r) for r in records],
           "planted": planted, "planted_detected": sum(p["detected"] for p in planted),
           "planted_right_unit": sum(p["right_unit"] for p in planted), "seconds": time.perf_counter() - t0}
    doc[provenance.KEY] = provenance.stamp(
        __file__, argv, seeds={"run": args.seed, "cases": "each case's own, seed * 100003 + its index (case.seed)"},
        peer=provenance.NotApplicable("counts of verdicts on correct outputs and planted defects, not a speed "
                                      "comparison"),
        timing=provenance.NotApplicable("nothing is timed: seconds is the run's wall time, for the budget"))
    suffix = f"_part{part}-of-{parts}" if parts > 1 else ""
    path = os.path.join(args.out_dir, "results", f"attention_false_alarms_{machine}{suffix}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    from harness.output_files import write_text_atomically

    write_text_atomically(path, json.dumps(doc, indent=2, default=str) + "\n", "attention false-alarm JSON")
    print(f"{len(records)} cases on {machine} ({dev}); false DIVERGED: {doc['false_diverged']}")
    for be, p in per.items():
        print(f"  {be}: {p}")
    print(f"planted: {doc['planted_detected']}/{len(planted)} detected, {doc['planted_right_unit']} at the right unit;"
          f" worst err/bound of a correct case {doc['worst_ratio']}; wrote {path}")
    return 0 if doc["false_diverged"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
