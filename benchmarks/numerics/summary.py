"""What a numerics run concludes and prints: the summary constants the tolerance models read
(`summary`, and `resummarise` for a stored result), the failures, the progress lines and the report,
and the lines to paste into oracle.judging.hardware_numerics.HW (`constants_snippet`).
"""

from __future__ import annotations

from benchmarks.numerics.fits import _summarise


def summary(res: dict) -> dict:
    """The constants the tolerance models read (oracle.judging.hardware_numerics.HW measure_key names), loosest
    over the engines of each kind; None where nothing was measured. fp8 constants come from the
    engines with a narrow accumulator (acc_bits < 23): max_num_imprecise_acc = 0 fits fp32-wide
    datapaths and is judged with acc_model any."""
    eng = res.get("engines", {})

    def fits(pred):
        return [eng[n]["fit"] for n in eng if eng[n].get("fit") and pred(eng[n])]

    def loosest(fs, key, fn):
        vals = [f[key] for f in fs if f.get(key) is not None]
        return fn(vals) if vals else None

    def truncates(fs):
        if not fs:
            return None
        return int(any("trunc" in f["align_round"] or "trunc" in f["acc_round"] for f in fs))

    tc16 = fits(lambda r: r["optype"] in ("bf16", "fp16"))
    tf32 = fits(lambda r: r["optype"] == "tf32") + [_summarise(eng[n]["step"]["consistent"]) for n in eng
                                                     if eng[n].get("optype") == "tf32" and not eng[n].get("fit")
                                                     and eng[n].get("step", {}).get("consistent")]
    fp8 = fits(lambda r: r["optype"] == "e4m3" and r["fit"]["acc_bits_min"] < 23)
    out = {
        "tc16_mma_k": loosest(tc16, "mma_k_min", min),
        "tc16_align_bits": loosest(tc16, "align_bits_min", min),
        "tc16_truncates": truncates(tc16),
        "tf32_mma_k": loosest(tf32, "mma_k_min", min),
        "tf32_align_bits": loosest(tf32, "align_bits_min", min),
        "tf32_truncates": truncates(tf32),
        "fp8_mma_k": loosest(fp8, "mma_k_min", min),
        "fp8_align_bits": loosest(fp8, "align_bits_min", min),
        "fp8_acc_bits": loosest(fp8, "acc_bits_min", min),
        "fp8_truncates": truncates(fp8),
        "fp8_promotion": {n: eng[n]["fit"].get("promotion") for n in eng
                          if eng[n].get("optype") == "e4m3" and eng[n].get("fit")},
    }
    # the largest value no engine's data contradicts: a recorded constant above it is unsound; one
    # between the *_min above and it is one the data here cannot tell apart from a looser one
    for fam, fs in (("tc16", tc16), ("tf32", tf32), ("fp8", fp8)):
        for param in ("mma_k", "align_bits"):
            out[f"{fam}_{param}_consistent_max"] = loosest(fs, f"{param}_max", min)

    def operand_trunc(names):
        ops = [c for n in names for c in eng[n].get("operand", {}).get("consistent", [])]
        return int(any(o["operand_round"] == "trunc" for o in ops)) if ops else None

    tf32_names = [n for n in eng if eng[n].get("optype") == "tf32"]
    out["tf32_operand"] = {n: eng[n].get("operand", {}).get("consistent") for n in tf32_names}
    out["tf32_operand_trunc"] = operand_trunc(tf32_names)
    out["cublas_tf32_operand_trunc"] = operand_trunc([n for n in tf32_names if n.startswith("cublas")])
    sk = res.get("splitk", {})
    out["splitk"] = {d: [{"shape": r["shape"], "partials": r["partials"], "chunk": r.get("chunk"),
                          "boundaries": r["boundaries"][:8], "partial_sum": r.get("partial_sum")}
                         for r in v.get("shapes", []) if r.get("boundaries")] for d, v in sk.items()}
    chunks = [b for v in sk.values() for r in v.get("shapes", []) for b in
              ([r["boundaries"][0]] + [y - x for x, y in zip(r["boundaries"], r["boundaries"][1:])]
               if r.get("boundaries") else [])]
    out["splitk_chunk_min"] = min(chunks) if chunks else None
    acts = {k: v for k, v in res.get("activations", {}).items() if isinstance(v, dict)}
    for kind in ("gelu_tanh", "silu"):
        vals = [v["max_err_over_u32_x_plus_y"] for v in acts.values() if v["activation"] == kind]
        out[f"act_{kind}_fast"] = max(vals) if vals else None
    out["int8_exact"] = res.get("int8", {}).get("ok")
    return out


def resummarise(res: dict) -> dict:
    """The summary of a stored result, recomputed from its raw fits (the consistent datapaths of
    each engine) with this version's rules, whatever version wrote it."""
    res = dict(res, engines={n: dict(r, fit=_summarise(r["ladder"]["consistent"]) if r.get("ladder") else {})
                             for n, r in res.get("engines", {}).items()})
    return summary(res)


def failures(res: dict) -> list[str]:
    out = []
    for n, r in res.get("engines", {}).items():
        if r.get("ok") is False:
            fams = [f for f in ("operand", "step", "ladder") if f in r and not r[f]["consistent"]]
            out.append(f"{n}: no candidate datapath reproduces the {', '.join(fams)} probes")
    for d, sk in res.get("splitk", {}).items():
        for row in sk.get("shapes", []):
            if not row["explained"]:
                out.append(f"splitk {d} {row['shape']}: reduced-precision output differs ({row['outlier_differs']} "
                           f"elements) but no partial boundary was found")
            if "unexpected" in row:
                out.append(f"splitk {d} {row['shape']}: boundary probes gave values other than 0 or 1")
    if res.get("int8", {}).get("ok") is False:
        out.append("int8: torch._int_mm differs from the exact integer sum")
    for fam, tb in res.get("family_errors", {}).items():
        out.append(f"{fam}: the measurement itself failed: {tb.strip().splitlines()[-1]}")
    return out


def _progress(r: dict) -> None:
    if r.get("ok") is None:
        print(f"  {r['engine']:<22} unavailable: {r.get('unavailable', '')[:100]}", flush=True)
        return
    f = r.get("fit") or {}
    print(f"  {r['engine']:<22} {'ok ' if r['ok'] else 'FAIL'} align_bits>={f.get('align_bits_min')} "
          f"acc_bits>={f.get('acc_bits_min')} round={f.get('align_round')}/{f.get('acc_round')} "
          f"fused={f.get('fused')} mma_k={f.get('mma_k_min')}..{f.get('mma_k_max')} promotion={f.get('promotion')} "
          f"({f.get('candidates', 0)} fits, {r['seconds']} s)", flush=True)


def print_report(res: dict) -> None:
    s = res["summary"]
    print("\nsummary")
    for k, v in s.items():
        print(f"  {k:<24} {v}")
    for d, sk in res.get("splitk", {}).items():
        for row in sk["shapes"]:
            print(f"  splitk {d} {row['shape']}: outlier diffs {row['outlier_differs']}, partials {row['partials']}, "
                  f"chunk {row.get('chunk')}, rounding {row.get('partial_rounding')}, sum {row.get('partial_sum')}")
    for row in res.get("envelope", {}).get("rows", []):
        if "unavailable" not in row:
            print(f"  envelope {row['engine']:<18} K={row['K']:<6} {row['kind']:<8} err/S {row['max_err_over_S']:.3g} "
                  f"err/sqrtV {row['max_err_over_sqrtV']:.3g}")
    for f in res["failures"]:
        print(f"FAILED: {f}")
    for n, r in res.get("engines", {}).items():
        for fam in ("operand", "step", "ladder"):
            if r.get(fam) and not r[fam]["consistent"]:
                for near in r[fam]["nearest"][:2]:
                    print(f"  seen ({n}, {fam}): nearest candidate {near['candidate']} misses {near['mismatches']} of "
                          f"{near['of']}: {near.get('examples', [])[:2]}")


def constants_snippet(res: dict) -> str:
    """The entries of oracle.judging.hardware_numerics.HW that this run measured, as lines to paste there."""
    from oracle.judging import hardware_numerics

    env = res.get("environment", {})
    where = f"{env.get('gpu', '?')}, {env.get('date', '?')[:10]}, benchmarks/measure_numerics.py"
    lines = []
    for key, c in hardware_numerics.HW.items():
        if not c.measure_key:
            continue
        v = res.get("summary", {}).get(c.measure_key)
        if v is None:
            lines.append(f"    # {key}: not measured by this run (summary.{c.measure_key} is empty)")
            continue
        lines.append(f'    "{key}": Constant({v!r}, "measured on {where}: summary.{c.measure_key}", '
                     f'"{c.measure_key}", "{c.sound}"),')
    return "\n".join(lines)
