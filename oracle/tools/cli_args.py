"""The command line's grammar: every subcommand's flags and how a bad command line is reported (one
`error:` line, exit 2). The commands themselves are oracle.tools.cli."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Mapping

from oracle.judging.diagnose import EXIT_USAGE

ATTENTION_CALLS = ("sdpa", "flash")  # how verify --attention calls an attention op


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line reported as one `error:` line (exit 2), as every bad input is."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (--help lists the options)\n")


def _seconds(text: str) -> float:
    """A --timeout value: a positive, finite number of seconds."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive, finite number of seconds")
    return v


def _positive_int(text: str) -> int:
    """A --repeat value: an integer from 1 to 100."""
    from oracle.run.case_types import MAX_REPEAT

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= v <= MAX_REPEAT:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 1 to {MAX_REPEAT}")
    return v


def _trust_flags(p: argparse.ArgumentParser) -> None:
    """The opt-ins of oracle.run.case_files: what a case file may do beyond the default."""
    p.add_argument("--allow-library", action="store_true", help="run a case's launch library ([kernel] library): "
                   "its host code is compiled and runs in the kernel's child process with your rights; without this "
                   "flag such a case is refused")
    p.add_argument("--allow-outside-case-dir", action="store_true", help="let a case file name files ([kernel] "
                   "source, library, cubin; extends) outside its own folder (extends: and the folder above it)")


def build_parser(commands: Mapping[str, Callable]) -> argparse.ArgumentParser:
    """Every subcommand's flags; `commands` maps each name to its function (oracle.tools.cli),
    whose docstring is its --help description."""
    cmd_compare, cmd_simulate, cmd_bench, cmd_repro = (commands[n] for n in ("compare", "simulate", "bench", "repro"))
    cmd_verify, cmd_env, cmd_knobs, cmd_serve = (commands[n] for n in ("verify", "env", "knobs", "serve"))
    p = _Parser(prog="python -m oracle",
                                description="Differential oracle for GEMM-like CUDA kernels: names the first "
                                            "stage whose results diverge.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("compare", help="judge a recorded run stage by stage", description=cmd_compare.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("case", nargs="?", metavar="CASE.toml", help="live: a case file (the same as --problem CASE.toml)")
    c.add_argument("--dump", metavar="FILE", help="a dump file (safetensors + JSON metadata)")
    c.add_argument("--demo", action="store_true", help="the embedded demo recording (no GPU needed)")
    c.add_argument("--repro-dir", metavar="DIR", help="the run of a reproducer (python -m oracle repro): its "
                   "inputs, D and sink.bin")
    c.add_argument("--sink", metavar="FILE", help="with --repro-dir: the sink file (default DIR/sink.bin)")
    c.add_argument("--problem", action="append", metavar="CASE.toml|k=v,...",
                   help="live: a case TOML and/or inline problem fields (repeatable)")
    c.add_argument("--set", action="append", metavar="k=v", help="live: override one problem field")
    c.add_argument("--kernel", metavar="FILE.cu", help="live: the kernel source")
    c.add_argument("--entry", metavar="NAME", help="live: the kernel's extern \"C\" entry point")
    c.add_argument("--inputs", metavar="LADDER", default="random",
                   help="live: ones | index | ktag | random[:seed] | dump:PATH (default random:0)")
    c.add_argument("--trace-tiles", metavar="\"TM,TN ...\"", help="live: output tiles to trace (default: first, "
                   "middle, last)")
    c.add_argument("--trace-k-blocks", metavar="KB,KB,...", help="live: k-blocks to trace (default: all)")
    c.add_argument("--trace-groups", metavar="G,G,...", help="live: groups or batch entries to trace, at most 4 "
                   "(default: all)")
    c.add_argument("--trace-stages", metavar="STAGE,...", help="live: stages to trace (default: all; name only "
                   "those the kernel taps to size the sink tighter)")
    c.add_argument("--time", action="store_true",
                   help="live: also time the kernel, the Triton reference and cuBLAS (same discipline)")
    c.add_argument("--timeout", type=_seconds, metavar="S", help="live: kernel time limit (default "
                   "ORACLE_KERNEL_TIMEOUT_S)")
    c.add_argument("--repeat", type=_positive_int, metavar="N", help="live: run the traced and the untraced build N "
                   "times each on the same inputs and compare every output and tap bit for bit (default: the case's "
                   "[run] repeat, else 1)")
    c.add_argument("--untraced-entry", metavar="NAME", help="live: the entry point in the build without "
                   "-DORACLE_TRACE (default: [kernel] untraced_entry, else --entry)")
    c.add_argument("--smem-poison", metavar="PATTERN", help="live: run the traced build twice more with its dynamic "
                   "shared memory filled with PATTERN (a 32-bit word, e.g. 0xFFFFFFFF) and with its complement; "
                   "outputs that differ read shared memory never written")
    c.add_argument("--sanitize", action="store_true", help="live: run the untraced build under compute-sanitizer "
                   "(racecheck, synccheck, memcheck, initcheck) and report its findings")
    c.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    c.add_argument("--html", metavar="PATH", help="also write the report as one self-contained HTML page to PATH "
                   "(pictures inline, no network needed)")
    c.add_argument("--save-dump", metavar="PATH", help="save the judged recording as a dump to PATH")
    c.add_argument("--quiet", action="store_true", help="print nothing; the exit code and --json say it all")
    c.add_argument("--plots", metavar="DIR", help="write PNG pictures of every diverging stage to DIR (matplotlib)")
    _trust_flags(c)
    c.set_defaults(func=cmd_compare)

    s = sub.add_parser("simulate", help="write a synthetic dump with an optional defect",
                       description=cmd_simulate.__doc__)
    s.add_argument("--out", required=True, metavar="PATH")
    s.add_argument("--defect", default=None)
    s.add_argument("--defect-tile", type=int, nargs=2, default=(0, 0), metavar=("TM", "TN"))
    s.add_argument("--defect-k-block", type=int, default=1)
    s.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "K"), help="a GEMM's (default 128 128 256)")
    s.add_argument("--tile", type=int, nargs=3, metavar=("BM", "BN", "BK"), help="a GEMM's (default 64 64 64)")
    s.add_argument("--dtype", default="bf16")
    s.add_argument("--out-dtype", default="bf16")
    s.add_argument("--swizzle", type=int, default=128)
    s.add_argument("--inputs", default="random")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--block-scaled", action="store_true", help="the block-scaled fp8 model (scale defects)")
    s.add_argument("--scale-dtype", choices=("fp32", "e8m0", "e4m3"), help="--block-scaled: its scales (default fp32)")
    s.add_argument("--scale-groups", type=int, help="--block-scaled: scale groups per k-block (default 1)")
    s.add_argument("--attention", action="store_true", help="an attention recording (the flags below)")
    s.add_argument("--batch", type=int, help="attention: sequences (default 1)")
    s.add_argument("--heads", type=int, help="attention: query heads (default 2)")
    s.add_argument("--heads-kv", type=int, help="attention: KV heads (default: --heads)")
    s.add_argument("--queries", type=int, help="attention: queries per sequence (default 64)")
    s.add_argument("--keys", type=int, help="attention: keys per sequence (default 96)")
    s.add_argument("--head-dim", type=int, help="attention: head dimension (default 32)")
    s.add_argument("--causal", choices=("none", "top_left", "bottom_right"), help="attention (default bottom_right)")
    s.add_argument("--blocks", type=int, nargs=2, metavar=("BQ", "BKV"), help="attention: block sizes (default 32 32)")
    s.add_argument("--splits", type=int, help="attention: split-KV partials; --block-scaled: split-K (default 1)")
    s.add_argument("--page-size", type=int, help="attention: a paged KV cache of this many keys a page")
    s.set_defaults(func=cmd_simulate)

    b = sub.add_parser("bench", help="benchmark-and-verify a list of live cases", description=cmd_bench.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--cases", required=True, metavar="FILE.toml")
    b.add_argument("--shard", metavar="i/n", help="run cases i, i+n, i+2n, ... (0-based)")
    b.add_argument("--jsonl", metavar="PATH", help="write one JSON line per case, with the environment")
    b.add_argument("--workers", type=int, metavar="N", help="worker processes (default: one per visible GPU)")
    b.add_argument("--no-time", action="store_true", help="verify only")
    b.add_argument("--html", metavar="DIR", help="write every case's HTML page and an index.html linking them to DIR")
    _trust_flags(b)
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("repro", help="write a standalone reproducer (.cu + Makefile, no Python needed)",
                       description=cmd_repro.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--problem", action="append", metavar="CASE.toml|k=v,...",
                   help="a case TOML and/or inline problem fields (repeatable)")
    r.add_argument("--set", action="append", metavar="k=v", help="override one problem field")
    r.add_argument("--kernel", metavar="FILE.cu", help="the kernel source")
    r.add_argument("--entry", metavar="NAME", help="the kernel's traced extern \"C\" entry point")
    r.add_argument("--inputs", metavar="LADDER", default=None,
                   help="ones | index | ktag | random[:seed] | dump:PATH (default random:0)")
    r.add_argument("--dump", metavar="FILE", help="take the problem and the inputs from a recording")
    r.add_argument("--trace-tiles", metavar="\"TM,TN ...\"", help="output tiles the traced build records")
    r.add_argument("--trace-k-blocks", metavar="KB,KB,...", help="k-blocks the traced build records")
    r.add_argument("--trace-groups", metavar="G,G,...", help="groups or batch entries the traced build records")
    r.add_argument("--no-reference", action="store_true",
                   help="write no expected.bin/bound.bin: repro computes its own host reference")
    r.add_argument("--out", required=True, metavar="DIR", help="the directory to write")
    _trust_flags(r)
    r.set_defaults(func=cmd_repro)

    vf = sub.add_parser("verify", help="benchmark-and-verify a torch op over a sweep", description=cmd_verify.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    vf.add_argument("--op", required=True, metavar="MODULE:FUNCTION", help="the op, e.g. torch:matmul")
    vf.add_argument("--sweep", metavar="FILE.toml", help="the cases (oracle/tools/verify.py)")
    vf.add_argument("--shape", action="append", metavar="MxNxK",
                    help="a case shape (repeatable; attention: B,HQ,HKV,LQ,LK,D)")
    vf.add_argument("--dtype", default="bf16", help="operand type for --shape cases (default bf16)")
    vf.add_argument("--call", choices=("matmul", "scaled_mm", "scaled_mm_block", *ATTENTION_CALLS),
                    help="how the op is called (default matmul; a w4a16 op, with its quant table, from a --sweep "
                    "file); attention: sdpa op(q, k, v, is_causal=) or flash op(q, k, v, causal=) (default: sdpa "
                    "for bhsd, flash for bshd)")
    vf.add_argument("--fast-accum", action="store_true", help="scaled_mm: use_fast_accum=True for --shape cases")
    vf.add_argument("--attention", action="store_true", help="an attention op (--shape B,HQ,HKV,LQ,LK,D)")
    vf.add_argument("--causal", metavar="none|top_left|bottom_right",
                    help="attention --shape cases: the causal mask (default none; top_left is SDPA's is_causal)")
    vf.add_argument("--layout", metavar="bshd|bhsd",
                    help="attention --shape cases: the op's tensors (default: bhsd for sdpa, bshd for flash)")
    vf.add_argument("--shard", metavar="i/n", help="run cases i, i+n, ... (0-based)")
    vf.add_argument("--jsonl", metavar="PATH", help="one JSON line per case, with the environment")
    vf.add_argument("--workers", type=int, metavar="N", help="worker processes (default: one per visible GPU)")
    vf.add_argument("--html", metavar="DIR", help="write every case's HTML page and an index.html linking them to DIR")
    vf.set_defaults(func=cmd_verify)

    e = sub.add_parser("env", help="print what a bug report needs", description=cmd_env.__doc__)
    e.add_argument("--json", action="store_true", help="as JSON")
    e.set_defaults(func=cmd_env)

    k = sub.add_parser("knobs", help="list the ORACLE_* environment knobs", description=cmd_knobs.__doc__)
    k.set_defaults(func=cmd_knobs)

    v = sub.add_parser("serve", help="keep a warm oracle answering commands on a Unix socket",
                       description=cmd_serve.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("--socket", metavar="PATH", help="the socket path, used as given (default: the private "
                   "default socket, which ORACLE_SERVER=auto names); point ORACLE_SERVER at it")
    v.add_argument("--warm", action="append", default=[], metavar="CASE",
                   help="a case file whose references to compile before the first command (repeatable)")
    v.set_defaults(func=cmd_serve)
    return p
