"""Command line: a thin shell over the library. `python -m oracle <command> --help`."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from dataclasses import replace
from typing import Optional, Sequence

from oracle.judging.diagnose import EXIT_NO_GPU, EXIT_USAGE

from oracle.tools.cli_args import ATTENTION_CALLS
from oracle.tools.startup import prestart_for
from oracle.tools.demo import DEMO_PATH as DEMO_DUMP


class UsageError(Exception):
    """Bad arguments or bad input: exit code 2."""


def cmd_compare(args: argparse.Namespace) -> int:
    """Judge a kernel stage by stage and name the first divergent stage.

    Offline: a dump (--dump FILE), the embedded demo (--demo), or the run of a standalone
    reproducer (--repro-dir DIR: its inputs, D and the sink.bin of repro_traced; --sink FILE).
    Live (needs a GPU): build, run and trace a kernel, then judge it:
        CASE.toml (or --problem CASE.toml)  the problem, and optionally [kernel], [launch], [trace]
        --problem m=256,n=256,k=512    or inline problem fields (override the TOML's)
        --kernel FILE.cu --entry NAME  the kernel (override the TOML's [kernel])
        --inputs ones|index|ktag|random[:seed]|dump:PATH
    A live case builds and runs its kernel's device code. The files a case file names stay inside
    its folder (--allow-outside-case-dir lifts that); a launch library ([kernel] library) is host
    code run in the kernel's child process, refused without --allow-library.
    Races (live): --repeat N runs the traced and the untraced build N times each on the same
    inputs and compares every output and tap bit for bit; --smem-poison PATTERN runs the traced
    build twice more with the kernel's dynamic shared memory filled with PATTERN and with its
    complement (kernels that call the trace header's smem_prologue()); --sanitize runs the
    untraced build under compute-sanitizer (racecheck, synccheck, memcheck, initcheck).
    Prints a table, one row per stage with the teacher-forced and chained verdicts, then one
    sentence naming the first divergence; --json PATH and --html PATH also write it for machines
    and as a page to look at (pictures inline, copyable commands to re-run it). Exit codes: 0 match, 1 divergence, 2 bad usage or
    input, 3 kernel error, 4 oracle untrusted, 5 mistrusted (nothing could discriminate),
    6 nondeterministic (runs on the same inputs differ), 7 a live case and no CUDA GPU visible
    (said before anything is built)."""
    from oracle.report import table as report
    from oracle.run.caller import Caller
    from oracle.tools.api import compare

    request = _request(args)
    judged = compare(request).judgement
    for line in judged.notices:
        print(line, file=sys.stderr)
    if args.save_dump:
        judged.recording.save(args.save_dump)
    if getattr(args, "plots", None):
        from oracle.report.plots import write_plots

        try:
            written = write_plots(judged.analysis, args.plots)
        except RuntimeError as e:
            raise UsageError(str(e)) from None
        if not args.quiet:
            for path in written:
                print(f"wrote {path}", file=sys.stderr)
    if args.json:
        report.write_json(judged, args.json, caller=Caller.COMMAND_LINE)
    if args.html:
        from oracle.report.html import write_html
        from oracle.tools.rerun import commands_for

        write_html(judged, args.html, commands_for(request, dump=args.save_dump))
    if not args.quiet:
        try:
            print(report.render(judged, Caller.COMMAND_LINE))
            if args.save_dump:
                print(f"saved the recording to {args.save_dump}")
            sys.stdout.flush()
        except BrokenPipeError:  # the reader stopped early (`| head`): the judgement stands
            _stdout_closed()
    return judged.exit_code


def _stdout_closed() -> None:
    """Standard output's reader is gone: what is left to print goes nowhere, quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _request(args: argparse.Namespace):
    """The RunRequest the compare command line asks for (UsageError for flags that do not go together)."""
    from oracle.run.request import RunRequest

    if args.case:
        args.problem = [args.case] + list(args.problem or [])
    live = bool(args.kernel or args.problem)
    modes = [bool(args.dump), bool(args.demo), live, bool(args.repro_dir)]
    if args.time and not live:
        raise UsageError("--time needs a live kernel: a recording has nothing to time")
    if args.time:  # before anything is built
        from oracle.run.timing import require_gpu

        require_gpu(UsageError, "run without --time, or on a machine with a GPU")
    if sum(modes) != 1:
        raise UsageError("give one of --dump FILE, --demo, --repro-dir DIR, or a live kernel (CASE.toml, --problem "
                         "CASE.toml and/or --kernel FILE.cu --entry NAME)")
    if args.sink and not args.repro_dir:
        raise UsageError("--sink FILE goes with --repro-dir DIR")
    if (args.repeat is not None or args.smem_poison is not None or args.sanitize or args.untraced_entry) and not live:
        raise UsageError("--repeat, --smem-poison, --sanitize and --untraced-entry need a live kernel: a recording "
                         "cannot be run again")
    if args.repro_dir:
        from oracle.repro.readback import load_repro_run

        return RunRequest(recording=load_repro_run(args.repro_dir, sink=args.sink), source=args.repro_dir)
    if not live:
        return RunRequest(dump=DEMO_DUMP if args.demo else args.dump)
    poison = None
    if args.smem_poison is not None:
        from oracle.run.races import parse_pattern

        try:
            poison = parse_pattern(args.smem_poison)
        except ValueError as e:
            raise UsageError(f"--smem-poison: {e}") from None
    request = RunRequest(case=_case(args), inputs=args.inputs or "random", repeat=args.repeat, smem_poison=poison,
                         sanitize=bool(args.sanitize), timeout_s=args.timeout,
                         command=("python", "-m", "oracle", *getattr(args, "argv", ("compare",))))
    if args.time:
        if request.races or request.sanitize:
            raise UsageError("--time measures one run: give it without --repeat, --smem-poison and --sanitize")
        request = replace(request, time=True)
    return request


def _case(args: argparse.Namespace, base: Optional[dict] = None, entry: Optional[str] = None):
    """The live case the command line names: a case TOML and inline problem fields (--problem),
    --set, the kernel and its entry, the untraced entry and the trace selection. `base` holds
    problem fields under the inline ones and --set; `entry` is the entry point when --entry is not
    given."""
    from oracle.run.caller import Caller
    from oracle.run.request import resolve_case

    toml_path, inline = None, []
    for p in args.problem or []:
        if p.endswith(".toml"):
            if toml_path:
                raise UsageError("give at most one case TOML (CASE.toml or --problem CASE.toml)")
            toml_path = p
        else:
            inline.append(p)
    return resolve_case(toml_path, base, assignments=inline + list(args.set or []), kernel=args.kernel,
                        entry=args.entry or entry, untraced_entry=getattr(args, "untraced_entry", None),
                        trace_tiles=_tiles_flag(args.trace_tiles) if args.trace_tiles else None,
                        trace_k_blocks=_indices_flag("--trace-k-blocks", args.trace_k_blocks)
                        if args.trace_k_blocks else None,
                        trace_groups=_indices_flag("--trace-groups", args.trace_groups)
                        if getattr(args, "trace_groups", None) else None,
                        trace_stages_text=getattr(args, "trace_stages", None),
                        trace_stages_where=Caller.COMMAND_LINE.option("trace_stages"),
                        untraced_entry_where=Caller.COMMAND_LINE.option("untraced_entry"),
                        allow_library=getattr(args, "allow_library", False),
                        allow_outside_case_dir=getattr(args, "allow_outside_case_dir", False))


def _indices_flag(flag: str, text: str) -> tuple[int, ...]:
    """'0,3,7' -> (0, 3, 7): non-negative integers, or a UsageError naming the flag."""
    out = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        if not part.isdigit():
            raise UsageError(f"{flag} {text!r}: {part!r} is not a non-negative integer")
        out.append(int(part))
    if not out:
        raise UsageError(f"{flag} {text!r} names nothing")
    return tuple(out)


def _tiles_flag(text: str) -> tuple[tuple[int, int], ...]:
    """'0,0 31,31' -> ((0, 0), (31, 31))."""
    tiles = []
    for pair in text.split():
        idx = _indices_flag("--trace-tiles", pair)
        if len(idx) != 2:
            raise UsageError(f"--trace-tiles {text!r}: {pair!r} is not a pair TM,TN")
        tiles.append(idx)
    if not tiles:
        raise UsageError(f"--trace-tiles {text!r} names no tile")
    return tuple(tiles)


def cmd_repro(args: argparse.Namespace) -> int:
    """Write a standalone reproducer: a directory with repro.cu, a Makefile, the inputs as binary
    files and the oracle's reference D and bounds, that builds with nvcc alone and runs without
    Python (oracle.repro.generate; README.txt in the directory says everything).
        --problem CASE.toml [--set k=v] [--kernel FILE.cu --entry NAME]
        --inputs ones|index|ktag|random[:seed]|dump:PATH   --trace-tiles, --trace-k-blocks, --trace-groups
        --dump FILE     the problem and inputs of a recording (the case TOML still gives the
                        kernel and its launch; the entry point is the recording's)
        --out DIR       the directory (new, or a reproducer written before)
        --allow-library, --allow-outside-case-dir   as for compare
    Only checked sources are copied: the translation unit and the local headers it includes (CUDA/C++
    sources by suffix and content, regular files, inside the source's tree), or a prebuilt cubin
    that is a CUDA device image; README.txt lists them.
    Then: make -C DIR && DIR/repro prints MATCH or DIVERGED (exit 0 / 1, 3 for a kernel error);
    make -C DIR TRACE=1 && DIR/repro_traced writes DIR/sink.bin, and
    python -m oracle compare --repro-dir DIR judges it stage by stage."""
    from oracle.repro.generate import write_repro

    base, entry, rec = None, None, None
    if args.dump:
        from oracle.run.recording import Recording

        if args.inputs:
            raise UsageError("--dump FILE already gives the inputs: drop --inputs")
        if not (args.problem or args.kernel):
            raise UsageError("a recording holds no kernel source or launch table: give the case TOML with --problem "
                             "(and --kernel/--entry if the case does not name them)")
        rec = Recording.load(args.dump)
        base = rec.spec.to_json()
        if not rec.synthetic and rec.kernel not in ("", "unknown"):
            entry = rec.kernel
    elif not (args.problem or args.kernel):
        raise UsageError("give a live case (--problem CASE.toml and/or --kernel FILE.cu --entry NAME) or --dump FILE")
    from oracle.run.execute import operands_for
    from oracle.run.sink import check_case
    from oracle.run.request import RunRequest

    case = _case(args, base=base, entry=entry)
    check_case(case)  # every check that needs no inputs, no build and no GPU, before any of them
    ops, prov = operands_for(RunRequest(case=case, inputs=f"dump:{args.dump}" if rec is not None else
                                        (args.inputs or "random")))
    if rec is not None:
        prov = rec.provenance  # the recording says where its values came from
    out = write_repro(case, ops, prov, args.out, reference=not args.no_reference)
    from oracle.repro.attention import REFERENCE_FILES

    reference_files = ("expected.bin", "bound.bin") + tuple(f"{n}.bin" for n in REFERENCE_FILES)
    inputs = sorted(f for f in out.files if f.endswith(".bin") and f not in reference_files)
    kernel_files = [f for f in out.files if f.startswith("kernel/")]
    print(f"wrote {out.path}: {case.spec.describe()}, inputs {prov.describe()}")
    print(f"  repro.cu, Makefile, README.txt, launch.txt, problem.txt, inputs.txt, {', '.join(inputs)}")
    if getattr(case.spec, "kind", "gemm") == "attention":
        print("  expected_o.bin, bound_o.bin, expected_lse.bin, bound_lse.bin: the oracle's reference O and LSE and "
              "their per-element bounds")
    else:
        print("  expected.bin, bound.bin: the oracle's reference D and per-element bounds" if out.reference else
              "  no expected.bin/bound.bin: repro computes its own double-precision reference")
    what = "kernel" if len(out.entries_traced) == 1 else f"{len(out.entries_traced)} launches, in order"
    print(f"  {what}: {', '.join(out.entries_traced)} (traced), {', '.join(out.entries_plain)} (untraced); "
          f"{len(kernel_files)} source file(s) under kernel/")
    print(f"build and run:  make -C {out.path} && {out.path}/repro")
    print(f"traced:         make -C {out.path} TRACE=1 && {out.path}/repro_traced && "
          f"python -m oracle compare --repro-dir {out.path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Keep one warm oracle answering commands on a Unix socket (see oracle.tools.server).

    Start it once, then set ORACLE_SERVER=auto (the default socket) or ORACLE_SERVER=PATH (the
    --socket given): `python -m oracle compare ...` (and bench, simulate, knobs, repro) run in the
    server without paying for `import torch` and Triton's kernel loading again, and print here.
    Without a server the commands run in their own process. The default socket is
    $XDG_RUNTIME_DIR/oracle/server.sock (when that folder is yours, mode 0700), else
    <tmp>/oracle-<uid>/server.sock in a folder made with mode 0700. The server answers only your
    user; the client sends nothing to a server of another user.
    --warm CASE (repeatable) compiles what judging that case launches before the first command is
    taken (oracle.tools.warmup: the case's problem shrunk, a model kernel's recording analysed)."""
    import signal
    import threading

    from oracle.tools.server import ServerError, default_socket, serve

    try:
        path = args.socket or default_socket(create=True)
    except (ServerError, OSError) as e:
        raise UsageError(str(e)) from None

    def warm():
        from oracle.tools.warmup import warm as warm_cases

        warm_cases(args.warm, log=lambda line: print(f"oracle server: {line}", file=sys.stderr, flush=True))

    def interrupt(*_):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)  # `kill` removes the socket as Ctrl-C does
    return serve(path, main, warm=warm if args.warm else None)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Write a synthetic dump made by a Python model of a kernel, optionally with one defect.

    Useful to see what the oracle reports for each defect class without a GPU.
    --attention: the attention model (oracle.run.attention_model) instead, on --batch, --heads,
    --heads-kv, --queries, --keys, --head-dim, --causal, --blocks BQ BKV, --splits, --page-size;
    --defect takes its defects' names (e.g. max_not_updated_before_rescale).
    --block-scaled: the block-scaled fp8 model (oracle.run.scale_model) on its small default problem,
    with --scale-dtype fp32, e8m0 (MX) or e4m3, --scale-groups G scale groups per k-block (a k-block G
    groups deep) and --splits (split-K); --defect takes its scale defects (e.g. scale_b_reused)
    and --inputs defaults to the scales ladder."""
    if args.attention:
        return _simulate_attention(args)
    if args.block_scaled:
        return _simulate_block_scaled(args)
    attention_only = [f"--{f.replace('_', '-')}" for f in ATTENTION_FLAGS if getattr(args, f) is not None]
    if attention_only:
        raise UsageError(f"{', '.join(attention_only)} go with --attention")
    args.shape, args.tile = args.shape or (128, 128, 256), args.tile or (64, 64, 64)
    from oracle.run.inputs import Provenance, make_operands
    from oracle.problem.spec import ProblemSpec, Tile
    from oracle.run.simulate import DEFECTS, Injection, simulate

    if args.defect and args.defect not in DEFECTS:
        raise UsageError(f"--defect {args.defect!r} is unknown; known: {', '.join(DEFECTS)}")
    m, n, k = args.shape
    spec = ProblemSpec(m=m, n=n, k=k, a_dtype=args.dtype, b_dtype=args.dtype, out_dtype=args.out_dtype,
                       tile=Tile(*args.tile), swizzle_a=args.swizzle, swizzle_b=args.swizzle)
    ops = make_operands(spec, args.inputs, args.seed)
    inj = Injection(args.defect, tuple(args.defect_tile), args.defect_k_block) if args.defect else None
    if inj is not None and inj.problems(spec):
        raise UsageError(f"--defect {args.defect} cannot show here: {'; '.join(inj.problems(spec))}")
    tiles = [tuple(args.defect_tile)] if args.defect else [(0, 0)]
    rec = simulate(spec, ops, Provenance(args.inputs, args.seed), injection=inj, tap_tiles=tiles)
    rec.save(args.out)
    print(f"wrote {args.out}: {rec.kernel}, {spec.describe()}, {len(rec.taps)} taps (synthetic)")
    return 0


def _simulate_block_scaled(args: argparse.Namespace) -> int:
    from oracle.run.scale_model import SCALE_DEFECTS, simulate_block_scaled

    if args.defect and args.defect not in SCALE_DEFECTS:
        raise UsageError(f"--defect {args.defect!r} is not a block-scaled defect; known: {', '.join(SCALE_DEFECTS)}")
    inputs = "scales" if args.inputs == "random" else args.inputs  # the default ladder: the scales one
    try:
        rec = simulate_block_scaled(args.defect, inputs, args.seed, args.scale_dtype or "fp32", args.scale_groups or 1,
                                    args.splits or 1)
    except ValueError as e:
        raise UsageError(str(e)) from None
    rec.save(args.out)
    print(f"wrote {args.out}: {rec.kernel}, {rec.spec.describe()}, {len(rec.taps)} taps (synthetic)")
    return 0


ATTENTION_FLAGS = ("batch", "heads", "heads_kv", "queries", "keys", "head_dim", "causal", "blocks", "splits",
                   "page_size")


def _simulate_attention(args: argparse.Namespace) -> int:
    from oracle.problem.attention import AttentionSpec
    from oracle.run.attention_simulate import simulate_attention

    gemm_only = [flag for flag, v in (("--shape", args.shape), ("--tile", args.tile)) if v is not None]
    if gemm_only or args.out_dtype != "bf16" or args.swizzle != 128 or args.defect_k_block != 1 or \
            tuple(args.defect_tile) != (0, 0):
        raise UsageError("--shape, --tile, --out-dtype, --swizzle, --defect-tile and --defect-k-block are a GEMM's: "
                         "drop them with --attention")
    heads = args.heads or 2
    bq, bkv = args.blocks or (32, 32)
    spec = AttentionSpec(batch=args.batch or 1, heads_q=heads, heads_kv=args.heads_kv or heads,
                         seqlen_q=64 if args.queries is None else args.queries,
                         seqlen_k=96 if args.keys is None else args.keys, head_dim=args.head_dim or 32,
                         causal=args.causal or "bottom_right", q_dtype=args.dtype, k_dtype=args.dtype,
                         v_dtype=args.dtype, o_dtype=args.dtype, block_q=bq, block_kv=bkv, splits=args.splits or 1)
    rec = simulate_attention(spec, defect=args.defect, inputs=args.inputs, seed=args.seed, page_size=args.page_size)
    rec.save(args.out)
    print(f"wrote {args.out}: {rec.kernel}, {rec.spec.describe()}, {len(rec.taps)} taps (synthetic)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark-and-verify a list of live cases (needs a GPU).

    Every case is judged stage by stage first, then timed (kernel, Triton reference, cuBLAS).
    Prints progress and a results table; --jsonl PATH writes one JSON object per case with the
    environment; --html DIR every case's HTML page and an index.html linking them. --shard i/n runs cases i, i+n, ... (0-based). With several visible GPUs one
    worker process runs per GPU. A case's `repeat = N` (default its live case's [run] repeat)
    verifies it as compare --repeat N does. --allow-library and --allow-outside-case-dir as for
    compare, for every case. Exit codes: 0 every case matches, 1 a case diverges (or
    is mistrusted or the oracle untrusted), 2 bad usage or a broken case, 3 a kernel error, 6 a
    case's repeated runs differ (NONDETERMINISTIC)."""
    from oracle.tools.bench import run_bench, table

    rows, code = run_bench(args.cases, shard_text=args.shard, jsonl=args.jsonl, workers=args.workers,
                           time_cases=not args.no_time, allow_library=args.allow_library,
                           allow_outside_case_dir=args.allow_outside_case_dir, html=args.html)
    print(table(rows))
    for r in rows:
        if r.get("error"):
            print(f"{r['name']}: {r['error']}", file=sys.stderr)
    return code


def cmd_verify(args: argparse.Namespace) -> int:
    """Benchmark-and-verify a torch op (module:function) over a sweep of shapes and dtypes.

    The op takes the operands and returns D (torch.matmul, torch._scaled_mm, a custom op). Every
    case is judged by the oracle (output only, tile by tile, with the case's numerics model), then
    timed against cuBLAS under the oracle's timing discipline; --html DIR writes every case's
    HTML page and an index.html linking them. The sweep: --sweep FILE.toml (see
    oracle/tools/verify.py), or --shape MxNxK (repeatable) with --dtype and --call. --shard i/n keeps
    cases i, i+n, ...; one worker per visible GPU. Exit codes: 0 every case matches, 1 a
    divergence, 2 bad usage or a broken case.

    --attention (or a sweep file with kind = "attention"): an attention forward op, e.g.
    torch.nn.functional:scaled_dot_product_attention, over --shape B,HQ,HKV,LQ,LK,D with --dtype,
    --causal none|top_left|bottom_right, --layout bshd|bhsd and --call sdpa|flash (see
    oracle/tools/verify_attention.py), judged by oracle.check_attention and timed against torch SDPA
    on a GPU (without one the timing is skipped with a note)."""
    from oracle.tools.verify import load_sweep, run_verify, shape_cases, table

    if bool(args.sweep) == bool(args.shape):
        raise UsageError("give --sweep FILE.toml or --shape MxNxK (one of them)")
    if args.attention or (args.sweep and _sweep_is_attention(args.sweep)):
        return _verify_attention(args)
    attention_only = [f for f, v in (("--causal", args.causal), ("--layout", args.layout)) if v is not None]
    if attention_only or args.call in ATTENTION_CALLS:
        raise UsageError(f"{', '.join(attention_only) or '--call ' + args.call} go with --attention (an attention op)")
    args.call = args.call or "matmul"
    cases = load_sweep(args.sweep) if args.sweep else shape_cases(args.shape, args.dtype, args.call,
                                                                             args.fast_accum)
    sweep_argv = ["--sweep", os.path.abspath(args.sweep)] if args.sweep else \
        [x for s in args.shape for x in ("--shape", s)] + ["--dtype", args.dtype, "--call", args.call] + \
        (["--fast-accum"] if args.fast_accum else [])
    rows, code = run_verify(args.op, cases, shard_text=args.shard, jsonl=args.jsonl, workers=args.workers,
                            sweep_argv=sweep_argv, html=args.html)
    print(table(rows))
    return code


def _sweep_is_attention(path: str) -> bool:
    from oracle.tools.verify_attention import KIND, sweep_kind

    return sweep_kind(path) == KIND


def _verify_attention(args: argparse.Namespace) -> int:
    from oracle.tools.verify_attention import load_sweep, run_verify, shape_cases, table

    gemm_only = [f for f, v in (("--fast-accum", args.fast_accum), ("--workers", args.workers)) if v]
    if args.call is not None and args.call not in ATTENTION_CALLS:
        gemm_only.append(f"--call {args.call}")
    if gemm_only:
        raise UsageError(f"{', '.join(gemm_only)} belong to a GEMM sweep: drop them with --attention")
    if args.sweep:
        given = [f for f, v in (("--causal", args.causal), ("--layout", args.layout), ("--call", args.call)) if v]
        if given:
            raise UsageError(f"{', '.join(given)} go with --shape; a sweep file's cases say them")
        cases = load_sweep(args.sweep)
    else:
        call = args.call or ("flash" if args.layout == "bshd" else "sdpa")
        cases = shape_cases(args.shape, args.dtype, args.causal or "none", args.layout, call)
    sweep_argv = ["--sweep", os.path.abspath(args.sweep)] if args.sweep else \
        [x for s in args.shape for x in ("--shape", s)] + ["--attention", "--dtype", args.dtype] + \
        [x for f, v in (("--causal", args.causal), ("--layout", args.layout), ("--call", args.call)) if v
         for x in (f, v)]
    rows, code = run_verify(args.op, cases, shard_text=args.shard, jsonl=args.jsonl, html=args.html,
                            sweep_argv=sweep_argv)
    print(table(rows))
    return code


def cmd_env(args: argparse.Namespace) -> int:
    """What a bug report needs: GPU, driver, CUDA, nvcc, torch, triton, cuda-python, the CUTLASS
    wheel, the oracle's version and its knobs (--json for machines)."""
    from oracle.tools.environment import describe, report_environment

    env = report_environment()
    if args.json:
        import json

        print(json.dumps(env, indent=1, default=str))
    else:
        print(describe(env))
    return 0


def cmd_knobs(args: argparse.Namespace) -> int:
    """List every ORACLE_* environment knob with its default, current value and meaning."""
    from tabulate import tabulate

    from oracle import knobs

    rows = [[k.name, k.default(), os.environ.get(k.name, ""), k.doc] for k in knobs.ALL]
    print(tabulate(rows, headers=["knob", "default", "set to", "meaning"]))
    return 0


COMMANDS = {"compare": cmd_compare, "simulate": cmd_simulate, "bench": cmd_bench, "repro": cmd_repro,
            "verify": cmd_verify, "env": cmd_env, "knobs": cmd_knobs, "serve": cmd_serve}


def build_parser() -> argparse.ArgumentParser:
    """The command line's grammar (oracle.tools.cli_args) over this module's commands."""
    from oracle.tools.cli_args import build_parser as grammar

    return grammar(COMMANDS)


def _choose_triton_backend() -> None:
    """Without a GPU, Triton can only run under its interpreter: select it before triton loads."""
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"


def _gpu_visible() -> bool:
    """A CUDA device is visible to torch (imported by then): a kernel's child started ahead can run."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available()


def main(argv: Optional[Sequence[str]] = None) -> int:
    _choose_triton_backend()
    from harness.errors import NoGpuError
    from oracle.errors import input_errors

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else 0
    args.argv = tuple(argv)
    started_child = _gpu_visible() and prestart_for(argv)  # in a process already up (a script, the server)
    try:
        return args.func(args)
    except (UsageError, *input_errors()) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NoGpuError as e:  # no one's fault: this machine has no GPU for a live run
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NO_GPU
    except BrokenPipeError:  # the reader of the output stopped early: not the command's error
        _stdout_closed()
        return 141  # as a shell reports a command ended by SIGPIPE
    except OSError as e:  # a path the command line named: missing, unreadable, unwritable
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        print("error: the oracle itself failed (above); its verdict cannot be trusted", file=sys.stderr)
        return EXIT_CODES_INTERNAL
    finally:
        if started_child:  # a command that ran no kernel after all: an idle child would hold its context
            from harness.child_process import discard

            discard()


EXIT_CODES_INTERNAL = 4
