"""Hostile inputs for the oracle's readers: mutated trace buffers, dumps, case files and command lines.

Each input is made from a seed (random.Random(seed)) by mutating a real one: trace buffers built
with the header's writer (harness.trace_format.TraceWriter), the zoo's recordings
(tests/zoo/dumps/), the shipped case files and bench lists, and command lines around them. Each is
fed to its reader and the outcome sorted: accepted, refused with one of the documented error
types, an untyped exception (a defect: its traceback is kept), a hang (past HANG_S of CPU time), or an
allocation past the limits. A failure is rebuilt from its kind and seed (`make_trace(seed)`,
`make_dump(seed, ...)`, `make_case(seed, ...)`).

The CPU tier runs a few thousand of them, enough that each mutation kind is tried
(tests/cpu/test_fuzz_inputs.py, tests/cpu/test_fuzz_commands.py). As a script it runs the
long campaign in this process under an address-space limit and writes its counts:

    python tests/fuzz_inputs.py --traces 12000 --dumps 2400 --cases 400 --as-limit-gb 4 \\
        --json benchmarks/results/fuzz_inputs_cpu.json

and the new case fields (partitions, batch, groups, workspaces, launch fields) and oracle.check
arguments, recorded as entries of the same file:

    python tests/fuzz_inputs.py --traces 0 --dumps 0 --cases 0 --case-fields 600 --check-calls 1000 \\
        --entries benchmarks/results/fuzz_inputs_cpu.json
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import random
import re
import signal
import struct
import sys
import tempfile
import time
import tracemalloc
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRITON_INTERPRET", "1")

HANG_S = 20.0  # an input that takes more CPU seconds than this is a hang
HANG_WALL = 4  # or more than this many times HANG_S of wall time (a busy shared machine stretches the wall)
# The limits the campaign runs under (knobs), small so that a breach shows well inside the
# address-space limit of the long run.
LIMIT_MB = 256
KNOBS = {"ORACLE_DUMP_MAX_MB": str(LIMIT_MB), "ORACLE_TRACE_MAX_TAPS_MB": str(LIMIT_MB),
         "ORACLE_MAX_OPERAND_MB": str(LIMIT_MB), "ORACLE_CUBIN_MAX_MB": "64", "ORACLE_TRACE_MAX_MB": "512"}
# The parser may allocate its taps (within the limit) and a few times the buffer besides.
TRACE_MEMORY_SLACK = 8
BUILD_STUB = "fuzz: every check passed and the build was reached"


class Hang(Exception):
    """An input ran past HANG_S."""


@dataclass
class Tally:
    """The outcomes of one kind of input."""

    kind: str
    inputs: int = 0
    accepted: int = 0
    refused: Counter = field(default_factory=Counter)  # documented error type -> count
    untyped: list = field(default_factory=list)  # (seed, exception type, message, traceback tail)
    hangs: list = field(default_factory=list)  # seeds
    breaches: list = field(default_factory=list)  # (seed, what)
    seconds: float = 0.0
    extra: Counter = field(default_factory=Counter)

    def to_json(self) -> dict:
        return {"kind": self.kind, "inputs": self.inputs, "accepted": self.accepted,
                "refused": dict(sorted(self.refused.items())), "refused_total": sum(self.refused.values()),
                "untyped": len(self.untyped), "hangs": len(self.hangs), "limit_breaches": len(self.breaches),
                "seconds": round(self.seconds, 1), "extra": dict(self.extra),
                "untyped_examples": [list(u[:3]) for u in self.untyped[:10]],
                "hang_seeds": self.hangs[:10], "breach_examples": self.breaches[:10]}

    def failures(self) -> str:
        """A readable account of every defect found, for an assertion message."""
        lines = [f"{self.kind}: {len(self.untyped)} untyped, {len(self.hangs)} hangs, {len(self.breaches)} breaches"]
        lines += [f"  seed {s}: {t}: {m}\n{tb}" for s, t, m, tb in self.untyped[:5]]
        lines += [f"  seed {s}: hang" for s in self.hangs[:5]]
        lines += [f"  seed {s}: {w}" for s, w in self.breaches[:5]]
        return "\n".join(lines)

    @property
    def clean(self) -> bool:
        return not (self.untyped or self.hangs or self.breaches)


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[list]:
    """Raise Hang past `seconds` of this process's CPU time or HANG_WALL times that of wall time. Yields
    a list that holds True once the limit fired: the code under test may catch the Hang or wrap it (Triton's
    interpreter raises it again as InterpreterError, and a command reports it as its own failure, exit 4),
    and the input is a hang all the same."""
    fired: list = []

    def fire(signum, frame):
        fired.append(True)
        raise Hang()

    old = {sig: signal.signal(sig, fire) for sig in (signal.SIGALRM, signal.SIGPROF)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, seconds * HANG_WALL)
    try:
        yield fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def knobs(values: dict[str, str] = KNOBS) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _record(tally: Tally, seed: int, fn: Callable[[], Any], typed: tuple[type, ...]) -> Any:
    """Run one input and sort its outcome into `tally`; the result when it was accepted."""
    tally.inputs += 1
    fired: list = []
    try:
        with time_limit(HANG_S) as fired:
            out = fn()
    except Exception as e:
        if fired or isinstance(e, Hang):  # the limit, however the code under test passed it on
            tally.hangs.append(seed)
        elif isinstance(e, typed):
            tally.refused[type(e).__name__] += 1
        else:  # the defect this campaign looks for
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-4:])
            tally.untyped.append((seed, type(e).__name__, str(e)[:300], tb))
        return None
    if fired:  # the code under test caught the Hang and went on
        tally.hangs.append(seed)
        return None
    tally.accepted += 1
    return out


def count_kinds(tally: Tally, how: str, kinds: dict[str, str]) -> None:
    """Count, in tally.extra as "kind: NAME", each mutation kind of `kinds` (name -> regex over one
    "; "-separated part of `how`) the input carries: the tier asserts every kind was tried."""
    parts = how.split("; ")
    for name, pattern in kinds.items():
        if any(re.search(pattern, part) for part in parts):
            tally.extra[f"kind: {name}"] += 1


def kinds_missing(tally: Tally, kinds: dict[str, str]) -> list[str]:
    """The mutation kinds of `kinds` that no input of the tally carried."""
    return [name for name in kinds if not tally.extra[f"kind: {name}"]]


# ---------------------------------------------------------------------------------------------
# Values that break assumptions
# ---------------------------------------------------------------------------------------------

BOUNDARY_INTS = (0, 1, 2, 3, 7, 8, 15, 16, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF,
                 0x80000000, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1)


def hostile_value(rng: random.Random, *, json_only: bool = False, depth: int = 0) -> Any:
    """A value of a random type: boundary numbers, odd strings, containers, deep nesting."""
    pick = rng.randrange(16 if depth < 3 else 12)
    if pick == 0:
        return rng.choice(BOUNDARY_INTS) * rng.choice((1, -1))
    if pick == 1:
        return rng.choice((10**30, -(10**30), 10**400 if json_only else 2**64, 2**31, -(2**31) - 1))
    if pick == 2:
        return rng.choice((0.5, -0.0, 1e308, 2.5, -1.5, 1e-300, float("nan"), float("inf"), -float("inf")))
    if pick == 3:
        return rng.choice(("", "x", "none", "all", "a", "b", "row", "col", "bf16", "fp64", "../../etc/passwd",
                           "/dev/zero", ".", "1 // 0", "m * 2", "__import__('os')", "\u00e9\u4e2d", "0,0 1,1"))
    if pick == 4:
        return "x" * rng.choice((100, 1000, 10000))
    if pick == 5:
        return rng.choice((True, False))
    if pick == 6:
        return None if json_only else rng.choice((0, ""))
    if pick == 7:
        return rng.choice(([], [1, 2], [[0, 0]], [0, 1, 2, 3], [-1], [1.5], ["a"], [True]))
    if pick == 8:
        return rng.choice(({}, {"a": 1}, {"kind": "block", "block": 5}, {"x": []}))
    if pick == 9:
        return rng.randrange(-5, 300)
    if pick == 10:
        return rng.getrandbits(rng.choice((8, 16, 32, 64)))
    if pick == 11:
        return rng.choice((1, 64, 128, 200, 4096, 65536, 10**9))
    if pick == 12:
        return [hostile_value(rng, json_only=json_only, depth=depth + 1) for _ in range(rng.randrange(4))]
    if pick == 13:
        return {rng.choice(("a", "b", "kind", "tile", "m", "x")): hostile_value(rng, json_only=json_only, depth=depth + 1)
                for _ in range(rng.randrange(3))}
    if pick == 14:
        deep: Any = 1
        for _ in range(rng.choice((5, 50, 200, 200, 900))):
            deep = [deep]
        return deep
    return rng.random() * rng.choice((1, 1e6, 1e40))


def expression(rng: random.Random, depth: int = 0) -> str:
    """A grid or literal expression: mostly well-formed, often failing when evaluated, sometimes
    using what the evaluator refuses."""
    leaves = ("m", "n", "k", "tiles", "tiles_m", "tiles_n", "k_blocks", "num_sms", "lda", "ldd", "batch", "q",
              "0", "1", "2", "7", "128", "1e308", "2.5", "-3", str(10**20), "0x10", "1_000")
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(leaves)
    a, b = expression(rng, depth + 1), expression(rng, depth + 1)
    forms = (f"{a} + {b}", f"{a} - {b}", f"{a} * {b}", f"{a} // {b}", f"-{a}", f"min({a}, {b})", f"max({a}, {b}, 1)",
             f"cdiv({a}, {b})", f"({a})", f"{a} ** {b}", f"{a} / {b}", f"{a} % {b}", "min()", f"min({a})",
             f"cdiv({a})", f"cdiv({a}, {b}, 1)", f"{a}.real", f"[{a}]", f"lambda: {a}", f"{a} if {b} else 1",
             f"({a}", f"abs({a})", f"min(x={a})", f"min(*[{a}])", "+".join([a] * rng.choice((2, 50, 700))),
             "-" * rng.choice((2, 300)) + a, "(" * 150 + a + ")" * 150, f"{a} * 1e308 * 1e308")
    return rng.choice(forms)


# ---------------------------------------------------------------------------------------------
# Trace buffers
# ---------------------------------------------------------------------------------------------

_HEADER_FIELDS = [(0, 4), (4, 2), (6, 2), (8, 8), (16, 8), (24, 4), (28, 4), (32, 4), (36, 4), (40, 4)] + \
    [(64 + 4 * i, 4) for i in range(64)] + [(320 + 4 * i, 4) for i in range(32)] + [(448 + 4 * i, 4) for i in range(16)]
_HEAD_FIELDS = [(0, 4), (4, 2), (6, 2), (8, 1), (9, 1), (10, 2), (12, 4), (16, 4), (20, 4), (24, 4), (28, 4),
                (32, 4), (36, 2), (38, 2), (40, 4), (44, 4)]
_BODY_WORDS = [(0, 2), (2, 2), (4, 2), (6, 2), (0, 4), (4, 4), (8, 4), (12, 4), (1, 1), (2, 2), (4, 1)]


def make_trace(seed: int) -> tuple[bytes, dict, bool, str]:
    """A trace buffer a kernel could have written, mutated: (buffer, block sizes, partial, how)."""
    import torch

    from harness import trace_format as tf
    from harness.taps import DescriptorRecord

    rng = random.Random(seed)
    bm, bn, bk = rng.choice((8, 16, 32, 64)), rng.choice((8, 16, 32)), rng.choice((4, 8, 16))
    blocks = dict(block_m=bm, block_n=bn, block_k=bk)
    version = rng.choice((1, 2, 3, 3))
    tiles = None if rng.random() < 0.4 else [(rng.randrange(-1, 3), rng.randrange(-1, 3))
                                             for _ in range(rng.randrange(1, 4))]
    kbs = None if rng.random() < 0.5 else sorted(rng.sample(range(8), rng.randrange(1, 4)))
    known = [s for s, c in tf.STAGE_CODES.items() if c <= tf.MAX_STAGE_CODE_OF_VERSION[version]]
    stages = None if rng.random() < 0.6 else rng.sample(known, rng.randrange(1, 6))
    writer_kw = dict(tiles=tiles, k_blocks=kbs, stages=stages, version=version)
    g = torch.Generator().manual_seed(seed)
    recs: list[tuple[int, int]] = []  # (offset, head bytes) of every record

    def values(shape, dtype):
        x = torch.randn(shape, generator=g) * 4
        return x.round().clamp(-100, 100).to(tf.DTYPE_TORCH[dtype])

    probe = tf.TraceWriter(1 << 18, **writer_kw)
    sites = [((tm, tn), kb) for tm in range(3) for tn in range(3) for kb in range(4)]
    rng.shuffle(sites)  # each record its own tap: an unmutated buffer is a valid trace
    epilogue_taps: set = set()
    for _ in range(rng.randrange(1, 9)):
        what = rng.randrange(7)
        tile, kb = sites.pop()
        slot = rng.choice((None, 0, 1))
        kw = {} if version == 1 else dict(partial=rng.choice((None, None, 0, 1)), group=rng.choice((None, None, 2)))
        if what == 0:
            dt = rng.choice(("bf16", "fp16", "e4m3", "fp32"))
            offs = [probe.block("load_a", tile, values((bm, bk), dt), shape=(bm, bk), k_block=kb, slot=slot, **kw)]
        elif what == 1:
            dt = rng.choice(("bf16", "int8", "e5m2"))
            n = rng.randrange(1, bk * bn + 1)
            idx = rng.sample(range(bk * bn), min(n, 64))
            offs = [probe.elements("load_b", tile, [i // bn for i in idx], [i % bn for i in idx],
                                   values((len(idx),), dt), shape=(bk, bn), k_block=kb, slot=slot, **kw)]
        elif what == 2:
            dt = rng.choice(("fp32", "int32", "fp16"))
            idx = rng.sample(range(bm * bn), min(bm * bn, rng.randrange(1, 128)))
            offs = [probe.elements("mma", tile, [i // bn for i in idx], [i % bn for i in idx], values((len(idx),), dt),
                                   shape=(bm, bn), k_block=kb, **kw)]
        elif what == 3:
            step = rng.choice([st for st in tf.STAGE_CODES if st.startswith("epilogue_")])
            if (step, tile) in epilogue_taps:  # no k-block: one tap per tile
                continue
            epilogue_taps.add((step, tile))
            offs = [probe.block(step, tile, values((bm, bn), "fp32"), shape=(bm, bn), **kw)]
        elif what == 4:
            op = rng.choice("ab")
            dt = rng.choice(("bf16", "e4m3", "fp32"))
            total = (bm if op == "a" else bn) * bk * tf.DTYPE_SIZE[dt]
            data = bytes(rng.getrandbits(8) for _ in range(total))
            cut = rng.randrange(1, total + 1)
            offs = [probe.image(f"descriptor_{op}", tile, data[:cut], k_block=kb, total_bytes=total, dtype=dt, **kw)]
            if cut < total and rng.random() < 0.7:
                offs.append(probe.image(f"descriptor_{op}", tile, data[cut:], k_block=kb, offset=cut,
                                        total_bytes=total, dtype=dt, **kw))
        elif what == 5:
            d = DescriptorRecord(operand=rng.choice("ab"), dtype=rng.choice(("bf16", "fp16", "e4m3")),
                                 global_dims=(64, 32), global_strides=(128,), box_dims=(64, 16),
                                 element_strides=(1, 1), swizzle=rng.choice((0, 32, 64, 128)),
                                 oob_fill=rng.choice(("zero", "nan")))
            offs = [probe.descriptor(d)]
        else:  # a record written twice (a replicated fragment): the same bits
            if not recs:
                continue
            last = probe.to_bytes()
            o = recs[-1][0]
            offs = [probe.raw(last[o:o + int.from_bytes(last[o:o + 4], "little")])]
        recs += [(o, tf.HEAD_BYTES_OF_VERSION[version]) for o in offs]
    written = probe.to_bytes()
    records = [written[o:o + int.from_bytes(written[o:o + 4], "little")] for o, _ in recs]
    used = sum(len(r) for r in records)
    capacity = tf.HEADER_BYTES + (used if rng.random() < 0.8 or not used else
                                  max(8, used - rng.randrange(1, used + 1)))
    capacity = max(capacity, tf.HEADER_BYTES + 8)
    w = tf.TraceWriter(-(-capacity // 8) * 8, **writer_kw)  # too small a sink drops records, as a device does
    for r in records:
        w.raw(r)
    buf = bytearray(w.to_bytes())
    how = []
    for _ in range(rng.choice((0, 1, 1, 2, 3, 5))):
        how.append(_mutate_trace(rng, buf, [r for r in recs if r[0] < len(buf)]))
    if rng.random() < 0.1:  # a buffer copied back to its extent only
        try:
            buf = buf[:tf.trace_extent(bytes(buf[:tf.HEADER_BYTES]))]
            how.append("cut to its extent")
        except Exception:  # the parser names the fault when the buffer is fed to it
            pass
    return bytes(buf), blocks, rng.random() < 0.3, "; ".join(how) or "unmutated"


def _put(rng: random.Random, buf: bytearray, off: int, width: int) -> None:
    v = rng.choice(BOUNDARY_INTS + (rng.getrandbits(8 * width),)) & ((1 << 8 * width) - 1)
    if off + width <= len(buf):
        buf[off:off + width] = v.to_bytes(width, "little")


# the body fields worth aiming at, by record kind: (offset from the body, width)
_BODY_FIELDS = {1: [(0, 4)],  # Elements: count
                2: [(0, 2), (2, 2), (4, 2), (6, 2)],  # Block: row0, col0, rows, cols
                3: [(0, 4), (4, 4), (8, 4)],  # Bytes: offset, nbytes, total_bytes
                4: [(0, 1), (1, 1), (2, 2), (4, 1), (8, 8), (48, 8), (80, 4), (100, 4)]}  # Descriptor


def _mutate_trace(rng: random.Random, buf: bytearray, recs: list[tuple[int, int]]) -> str:
    pick = rng.randrange(12)
    if pick == 0 and len(buf):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
        return f"bit flip at {i}"
    if pick == 1:
        off, width = rng.choice(_HEADER_FIELDS[:10] if rng.random() < 0.7 else _HEADER_FIELDS)
        _put(rng, buf, off, width)
        return f"header field at {off}"
    if pick == 2 and len(buf) >= 512:  # a k-block window: its base, and bits up to the window's end
        struct.pack_into("<I", buf, 28, 0)  # not ALL_K_BLOCKS
        struct.pack_into("<i", buf, 40, rng.choice((0, 1, 2**31 - 1, 2**31 - 1000, 2**31 - 33, rng.getrandbits(31))))
        word = rng.randrange(32)
        struct.pack_into("<I", buf, 320 + 4 * word, rng.choice((1, 0x80000000, 0xFFFFFFFF, rng.getrandbits(32))))
        return f"k-block window (kb_bits word {word})"
    if pick in (3, 4) and recs:
        base, hb = rng.choice(recs)
        off, width = rng.choice(_HEAD_FIELDS)
        if off >= hb:
            off -= 8
        _put(rng, buf, base + off, width)
        return f"record head field {off} of the record at {base}"
    if pick in (5, 6, 7) and recs:
        base, hb = rng.choice(recs)
        kind = buf[base + 4] if base + 4 < len(buf) else 0
        off, width = rng.choice(_BODY_FIELDS.get(kind, [(0, 4), (4, 4), (8, 4)]))
        _put(rng, buf, base + hb + off, width)
        return f"record body field {off} of the kind-{kind} record at {base}"
    if pick == 8:
        n = rng.randrange(len(buf) + 1)
        del buf[n:]
        return f"truncated to {n}"
    if pick == 9:
        extra = bytes(rng.choice((8, 64, 1000)))
        if rng.random() < 0.5:
            extra = bytes(rng.getrandbits(8) for _ in range(len(extra)))
        buf += extra
        return f"{len(extra)} bytes appended"
    if pick == 10 and len(buf) > 16:
        i = rng.randrange(len(buf) - 8)
        n = rng.randrange(1, min(256, len(buf) - i))
        buf[i:i + n] = bytes(n)
        return f"{n} bytes zeroed at {i}"
    if len(recs) >= 2:
        (a, _), (b, _) = rng.sample(recs, 2)
        n = min(56, len(buf) - max(a, b))
        buf[b:b + n] = buf[a:a + n]
        return f"record head at {a} copied over {b}"
    return "none"


# The mutation kinds of each campaign, as what their `how` strings say (count_kinds).
TRACE_KINDS = {"bit flip": r"^bit flip at", "header field": r"^header field at", "k-block window": r"^k-block window",
               "record head field": r"^record head field", "record body field": r"^record body field",
               "truncated": r"^truncated to \d", "bytes appended": r"bytes appended$",
               "bytes zeroed": r"bytes zeroed at", "record head copied": r"copied over \d",
               "cut to its extent": r"^cut to its extent$", "unmutated": r"^unmutated$"}


def run_traces(count: int, seed0: int = 0, tally: Optional[Tally] = None) -> Tally:
    """Parse `count` mutated buffers; a TraceFormatError is the only acceptable refusal, and memory
    stays within the taps' limit plus a few times the buffer."""
    from harness.trace_format import TraceFormatError, parse_trace

    tally = tally or Tally("trace buffers")
    limit = LIMIT_MB << 20
    t0 = time.perf_counter()
    for seed in range(seed0, seed0 + count):
        buf, blocks, partial, how = make_trace(seed)
        tracemalloc.start()
        try:
            res = _record(tally, seed, lambda: parse_trace(buf, **blocks, partial=partial, max_tap_bytes=limit),
                          (TraceFormatError,))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        if peak > TRACE_MEMORY_SLACK * len(buf) + limit + (4 << 20):
            tally.breaches.append((seed, f"parsing a {len(buf)}-byte buffer took {peak} bytes ({how})"))
        if res is not None:
            tally.extra["taps"] += len(res.taps)
            tally.extra["with warnings"] += bool(res.warnings)
        tally.extra["mutated"] += how != "unmutated"
        count_kinds(tally, how, TRACE_KINDS)
        if how == "unmutated" and res is None:
            tally.extra["unmutated refused"] += 1
    tally.seconds += time.perf_counter() - t0
    return tally


# ---------------------------------------------------------------------------------------------
# Dumps
# ---------------------------------------------------------------------------------------------

ZOO_DUMPS = ROOT / "tests" / "zoo" / "dumps"


def dump_corpus() -> list[tuple[str, bytes]]:
    """The zoo's recordings as plain safetensors bytes."""
    return [(p.name, gzip.decompress(p.read_bytes())) for p in sorted(ZOO_DUMPS.glob("*.safetensors.gz"))]


def _split(raw: bytes) -> tuple[dict, dict, bytes]:
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return header, json.loads(header["__metadata__"]["oracle.dump"]), raw[8 + n:]


def _join(header: dict, doc: Any, data: bytes) -> bytes:
    header = dict(header)
    header["__metadata__"] = dict(header["__metadata__"], **{"oracle.dump": json.dumps(doc)})
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """The paths to values inside a JSON document (down to depth 12, the first 6 entries of a list)."""
    out = [prefix]
    if len(prefix) >= 12:
        return out
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:6]):
            out += _paths(v, prefix + (i,))
    return out


def _edit(rng: random.Random, doc: Any, json_only: bool) -> tuple[Any, str]:
    """One structural edit of a JSON/TOML document: a value replaced, a key removed or added."""
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return hostile_value(rng, json_only=json_only), "replaced whole"
    path = rng.choice(paths)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    pick = rng.randrange(10)
    if pick < 6:
        parent[last] = hostile_value(rng, json_only=json_only)
        return doc, f"{'.'.join(map(str, path))} replaced"
    if pick < 8 and isinstance(parent, dict):
        del parent[last]
        return doc, f"{'.'.join(map(str, path))} removed"
    if pick == 8 and isinstance(parent, dict):
        parent[rng.choice(("extra", "x", "partial", "group", "source"))] = hostile_value(rng, json_only=json_only)
        return doc, f"{'.'.join(map(str, path[:-1]))} gained a key"
    if isinstance(parent, list):
        parent.append(parent[last] if rng.random() < 0.5 else hostile_value(rng, json_only=json_only))
        return doc, f"{'.'.join(map(str, path[:-1]))} gained an entry"
    parent[last] = hostile_value(rng, json_only=json_only)
    return doc, f"{'.'.join(map(str, path))} replaced"


def _retensor(rng: random.Random, raw: bytes, doc: dict) -> tuple[bytes, str]:
    """A tap's values (or an operand) in another dtype or shape, with the metadata saying so."""
    import torch
    from safetensors.torch import load, save

    tensors = load(raw)
    names = sorted(tensors)
    name = rng.choice(names)
    t = tensors[name]
    if rng.random() < 0.6:
        dtype = rng.choice((torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int32, torch.uint8,
                            torch.float8_e4m3fn, torch.bool))
        t = t.float().clamp(-100, 100).to(dtype) if dtype != torch.bool else t.float() != 0
        what = f"{name} as {dtype}"
    else:
        grow = [s + rng.choice((-1, 1)) if s > 1 else s + 1 for s in t.shape] if t.dim() else [2]
        t = torch.zeros(grow, dtype=t.dtype) if rng.random() < 0.5 else t.reshape(-1)[:max(1, t.numel() // 2)]
        what = f"{name} as {list(t.shape)}"
    tensors[name] = t.contiguous()
    m = re.fullmatch(r"tap\.(\d+)\.values", name)
    if m and int(m.group(1)) < len(doc.get("taps", [])):
        doc["taps"][int(m.group(1))].update(dtype=str(t.dtype).replace("torch.", ""), shape=list(t.shape))
    return save(tensors, metadata={"oracle.dump": json.dumps(doc)}), what


_BOMB: dict[int, Path] = {}


def _bomb(directory: Path, inflated: int) -> Path:
    """A gzip file of zeros that inflates to `inflated` bytes, made once per size."""
    if inflated not in _BOMB or not _BOMB[inflated].exists():
        p = directory / f"bomb_{inflated >> 20}mb.safetensors.gz"
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        with open(p, "wb") as f:
            zero = bytes(1 << 20)
            for _ in range(inflated >> 20):
                f.write(c.compress(zero))
            f.write(c.flush())
        _BOMB[inflated] = p
    return _BOMB[inflated]


def make_dump(seed: int, corpus: list[tuple[str, bytes]], directory: Path) -> tuple[Path, str]:
    """A zoo recording, mutated and written as a plain or gzip file: (path, how)."""
    rng = random.Random(seed)
    name, raw = corpus[rng.randrange(len(corpus))]
    header, doc, data = _split(raw)
    how = [name]
    pick = rng.randrange(22)
    if pick < 9:  # the metadata document
        for _ in range(rng.choice((1, 1, 2, 3))):
            doc, what = _edit(rng, doc, json_only=True)
            how.append(what)
        out = _join(header, doc, data)
    elif pick < 12:  # the tensor entries
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        key = rng.choice(sorted(tensors))
        entry = dict(tensors[key])
        field_ = rng.choice(("dtype", "shape", "data_offsets", "drop", "add"))
        if field_ == "drop":
            del header[key]
        elif field_ == "add":
            header["input.extra" if rng.random() < 0.5 else "tap.99.values"] = entry
        else:
            entry[field_] = hostile_value(rng, json_only=True) if rng.random() < 0.5 else \
                (rng.choice(("F64", "U8", "BOOL", "I64", "F8_E5M2")) if field_ == "dtype" else
                 [rng.randrange(0, 4 * len(data) + 2) for _ in range(2 if field_ == "data_offsets" else 2)])
            header[key] = entry
        how.append(f"tensor entry {key}: {field_}")
        out = _join(header, doc, data)
    elif pick < 15:  # raw bytes
        out = bytearray(raw)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(out))
            out[i] = rng.getrandbits(8)
        how.append("bytes changed")
        if rng.random() < 0.3:
            del out[rng.randrange(len(out)):]
            how.append("truncated")
        out = bytes(out)
    elif pick < 16:  # the header length
        out = bytearray(raw)
        out[:8] = rng.choice((0, 7, 8, len(raw), 2**63, rng.getrandbits(64))).to_bytes(8, "little")
        out = bytes(out)
        how.append("header length changed")
    elif pick < 17:  # the metadata nested past any parser
        header["__metadata__"]["oracle.dump"] = "[" * 100000 + "]" * 100000
        hb = json.dumps(header).encode()
        hb += b" " * (-len(hb) % 8)
        out = struct.pack("<Q", len(hb)) + hb + data
        how.append("metadata nested 100000 deep")
    elif pick < 20:  # a tensor re-typed or re-shaped, its metadata kept consistent: the checks of meaning
        out, what = _retensor(rng, raw, doc)
        how.append(what)
    else:
        out = raw
        how.append("unmutated")
    path = directory / f"d{seed}.safetensors"
    container = rng.randrange(10)
    if container < 4:
        path.write_bytes(out)
    elif container < 8:
        path = path.with_suffix(".safetensors.gz")
        z = gzip.compress(out, compresslevel=1)
        if container == 6:
            z = z[:rng.randrange(len(z))]
            how.append("gzip truncated")
        elif container == 7:
            z += bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
            how.append("gzip with trailing bytes")
        path.write_bytes(z)
    elif container == 8 and rng.random() < 0.2:
        return _bomb(directory, (LIMIT_MB + 64) << 20), "gzip bomb past the limit"
    else:
        path.write_bytes(out)
    return path, "; ".join(how)


DUMP_KINDS = {"metadata edited": r"( replaced| removed| gained a key| gained an entry)$",
              "tensor entry": r"^tensor entry ", "bytes changed": r"^bytes changed$", "truncated": r"^truncated$",
              "header length": r"^header length changed$", "metadata nested": r"^metadata nested",
              "tensor retyped or reshaped": r" as (torch\.|\[)", "unmutated": r"^unmutated$",
              "gzip truncated": r"^gzip truncated$", "gzip trailing bytes": r"^gzip with trailing bytes$",
              "gzip bomb": r"^gzip bomb"}


def run_dumps(count: int, seed0: int = 0, analyze_every: int = 0, tally: Optional[Tally] = None) -> Tally:
    """Load `count` mutated dumps: DumpError is the only acceptable refusal. Every
    `analyze_every`-th one that loads is judged too, by `compare --dump` with a JSON report: any
    exit code but 4, no traceback, and an exit 2 with one error line."""
    from harness.dump import DumpError
    from oracle.run.dumps import load_recording  # a GEMM's or an attention kernel's, as the dump says

    tally = tally or Tally("dumps")
    corpus = dump_corpus()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-dumps-") as tmp, knobs():
        directory = Path(tmp)
        loaded = 0
        for seed in range(seed0, seed0 + count):
            path, how = make_dump(seed, corpus, directory)
            tally.extra["gzip bombs"] += "bomb" in how
            tally.extra["unmutated"] += how.endswith("unmutated")
            count_kinds(tally, how, DUMP_KINDS)
            rec = _record(tally, seed, lambda: load_recording(str(path)), (DumpError,))
            if rec is None and how.endswith("unmutated") and path.suffix != ".gz":
                tally.extra["unmutated refused"] += 1
            if rec is not None:
                loaded += 1
                if analyze_every and loaded % analyze_every == 0:  # the same input judged, as compare --dump does
                    judged = Tally("judged")
                    argv = ["compare", "--dump", str(path), "--json", str(directory / "report.json")]
                    code = _record(judged, seed, lambda: run_command(argv)[0], ())
                    tally.extra["judged"] += 1
                    tally.extra[f"judged: exit {code}"] += 1
                    tally.untyped += judged.untyped
                    tally.hangs += judged.hangs
            if path.parent == directory and not path.name.startswith("bomb_"):
                path.unlink()
    tally.seconds += time.perf_counter() - t0
    return tally


# ---------------------------------------------------------------------------------------------
# Case files and command lines
# ---------------------------------------------------------------------------------------------

BASE_CASES = ("harness/examples/simple_gemm.toml", "zoo/hopper_gemm/hopper_gemm.toml",
              "zoo/hopper_gemm/hopper_gemm_e4m3.toml", "zoo/hopper_gemm/hopper_gemm_n16.toml",
              "zoo/hopper_gemm/defects/narrow_box.toml", "zoo/hopper_gemm/defects/wrong_stride.toml",
              # the newer surfaces: launch libraries (the example and CUTLASS through the adapter), a
              # quantised operand
              "harness/examples/simple_gemm_lib.toml", "zoo/cutlass_sm90/cutlass_sm90.toml",
              "zoo/w4a16_sm80/w4a16_gemm.toml",
              # attention (split-KV, paged KV), block scales (fp32 1x128 / 128x128, MX e8m0), and CUTLASS's
              # user routes: host code, EVT, stream-K, batched, grouped
              "zoo/fa3_sm90/d128.toml", "zoo/fa3_sm90/split.toml", "zoo/fa2_sm80/paged.toml",
              "zoo/deepgemm_sm90/deepgemm_sm90_splitk.toml", "zoo/mx_sm80/mx_sm80.toml",
              "zoo/cutlass_sm90/host.toml", "zoo/cutlass_sm90/evt.toml", "zoo/cutlass_sm90/streamk.toml",
              "zoo/cutlass_sm90/batched_host.toml", "zoo/cutlass_sm90/grouped.toml")
LIBRARY_CASES = ("harness/examples/simple_gemm_lib.toml", "zoo/cutlass_sm90/cutlass_sm90.toml",
                 "zoo/cutlass_sm90/host.toml", "zoo/cutlass_sm90/evt.toml", "zoo/cutlass_sm90/streamk.toml",
                 "zoo/cutlass_sm90/batched_host.toml", "zoo/cutlass_sm90/grouped.toml")
BENCH_LISTS = ("benchmarks/cases_simple_gemm.toml", "benchmarks/cases_zoo.toml")
SMALL = {"m": 40, "n": 24, "k": 96}


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        depth = 0
        while isinstance(v, list) and len(v) == 1 and isinstance(v[0], list):  # deep nesting, written flat
            v, depth = v[0], depth + 1
        return "[" * depth + "[" + ", ".join(_toml_value(x) for x in v) + "]" + "]" * depth
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return '""'  # TOML has no null


def toml_text(doc: dict) -> str:
    """A TOML document for a dict of scalars, tables and arrays of tables (enough for case files)."""
    lines, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append(f"[{_toml_key(k)}]\n" + "".join(f"{_toml_key(kk)} = {_toml_value(vv)}\n"
                                                         for kk, vv in v.items()))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            tables += [f"[[{_toml_key(k)}]]\n" + "".join(f"{_toml_key(kk)} = {_toml_value(vv)}\n" for kk, vv in x.items())
                       for x in v]
        else:
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}\n")
    return "".join(lines) + "\n".join(tables)


def _case_doc(rel: str) -> dict:
    """A shipped case file as a dict, its paths (source, cubin, extends) made absolute."""
    import tomllib

    path = ROOT / rel
    doc = tomllib.loads(path.read_text())
    for key in ("source", "cubin"):
        if key in doc.get("kernel", {}):
            doc["kernel"][key] = str(path.parent / doc["kernel"][key])
    if "extends" in doc:
        doc["extends"] = str(path.parent / doc["extends"])
    return doc


def _bench_doc(rel: str) -> dict:
    import tomllib

    path = ROOT / rel
    doc = tomllib.loads(path.read_text())
    for entry in [doc.get("defaults", {})] + doc.get("case", []):
        if "case" in entry:
            entry["case"] = str(path.parent / entry["case"])
        entry["set"] = dict(SMALL)
    return doc


def _targeted(rng: random.Random, doc: dict) -> str:
    """An edit aimed at what the case reader evaluates: grid entries, literals, map options, the trace."""
    launch = doc.setdefault("launch", {})
    if not isinstance(launch, dict):  # an earlier edit made it something else
        launch = doc["launch"] = {}
    pick = rng.randrange(6)
    if pick == 0 and isinstance(launch.get("grid"), list) and launch["grid"]:
        i = rng.randrange(len(launch["grid"]))
        launch["grid"][i] = expression(rng)
        return f"grid[{i}] = {launch['grid'][i][:60]}"
    if pick == 1 and isinstance(launch.get("args"), list):
        ctype = rng.choice(("i32", "u32", "i64", "u64", "f32", "f64", "i16"))
        launch["args"].append({ctype: expression(rng) if rng.random() < 0.8 else hostile_value(rng)})
        return f"a literal {ctype}"
    if pick == 2 and isinstance(launch.get("args"), list):
        opt = rng.choice(("rows", "stride_bytes", "box_inner", "swizzle", "oob_fill", "bogus"))
        launch["args"].insert(0, {"tensormap": rng.choice(("a", "b", "c")), opt: expression(rng)
                                  if rng.random() < 0.6 else hostile_value(rng)})
        return f"a tensormap with {opt}"
    if pick == 3:
        doc["trace"] = {rng.choice(("tiles", "k_blocks", "stages", "capacity_mb", "x")): hostile_value(rng)}
        return "trace table"
    if pick == 4:
        if not isinstance(doc.get("kernel", {}), dict):
            doc["kernel"] = {}
        doc.setdefault("kernel", {})[rng.choice(("source", "cubin", "entry", "defines", "arch", "time_entry"))] = \
            rng.choice(("/dev/zero", "/", "/nonexistent.cu", str(ROOT / "README.md"), "sm_1000", "", 5, [1, 2],
                        {"1X": 1}, {"OK": [1]}))
        return "a kernel key"
    doc["extends"] = rng.choice((".", "/dev/zero", "/", "missing.toml", 5, str(ROOT / "README.md")))
    return f"extends = {doc['extends']!r}"


FLAG_VALUES = {
    "--trace-tiles": ("a,b", "0,0 999,999", "0,0", "-1,0", "0,0,0", "", " ", "1,1 " * 40, "99999999999999999999,0",
                      "0,0 1,1 2,2"),
    "--trace-k-blocks": ("x", "-3", "0,1,2", "0,5000", "", "1e3", "0" + ",0" * 100, str(2**40), "0 1"),
    "--trace-stages": ("mma", "all", "", "epilogue_store", "mma,mma", "load_a,x"),
    "--set": ("m=100000000", "m=0", "m=-1", "m=1e400", "tile=[1,2]", "tile=[65536,64,16]", "a_dtype=fp64", "k=x",
              "m=2147483648", "=5", "m", "scale_a={kind=\"block\",block=5}", "alpha=nan", "alpha=1e400",
              "m=40,n=24,k=96", "batch=0", "promotion_interval=7", "tile=[[[[[[1]]]]]]"),
    "--inputs": ("ones", "index", "ktag", "random:7", "random:-1", "random:x", "ones:3", "dump:", "dump:/dev/zero",
                 "dump:/nonexistent", "bogus", "random:" + "9" * 30),
    "--timeout": ("-1", "0", "nan", "inf", "x", "1e400", "5"),
    "--entry": ("", "x", "a b", "zoo_hopper_bf16_traced"),
    "--kernel": ("/dev/zero", "/", "/nonexistent.cu", str(ROOT / "README.md")),
    "--problem": ("m=8,n=8,k=8", "m=8,n=8", "x=1", "m=[1,2]", "m=1,n=1,k=1,tile=[1,1,1]", "a.toml", "m=8,,n=8"),
}


def make_case(seed: int, directory: Path, dumps: dict[str, Path]) -> tuple[list[str], str]:
    """A command line around a mutated case file or bench list: (argv, how)."""
    rng = random.Random(seed)
    pick = rng.randrange(10)
    if pick < 2:  # a bench list
        doc = _bench_doc(rng.choice(BENCH_LISTS))
        how = ["bench list"]
        for _ in range(rng.choice((0, 1, 1, 2))):
            doc, what = _edit(rng, doc, json_only=False)
            how.append(what)
        if rng.random() < 0.2:
            doc["case"] = hostile_value(rng)
            how.append("case replaced")
        path = directory / f"b{seed}.toml"
        path.write_text(toml_text(doc) if isinstance(doc, dict) else _toml_value(doc))
        return ["bench", "--cases", str(path), "--workers", "1", "--no-time"], "; ".join(how)
    base = rng.choice(BASE_CASES)
    doc = _case_doc(base)
    how = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        if rng.random() < 0.5:
            how.append(_targeted(rng, doc))
        else:
            doc, what = _edit(rng, doc, json_only=False)
            how.append(what)
    path = directory / f"c{seed}.toml"
    path.write_text(toml_text(doc) if isinstance(doc, dict) else f"x = {_toml_value(doc)}\n")
    command = rng.choice(("compare", "compare", "compare", "repro"))
    argv = [command, "--problem", str(path)]
    if seed % 5:  # its paths were made absolute (_case_doc): most runs let them reach past the case's folder
        argv.append("--allow-outside-case-dir")
    if base in LIBRARY_CASES and seed % 3:  # most runs opt in to its host code, the rest check the refusal
        argv.append("--allow-library")
    if rng.random() < 0.7:
        argv += ["--set", ",".join(f"{k}={v}" for k, v in SMALL.items())]
    for flag in rng.sample(sorted(FLAG_VALUES), rng.choice((0, 1, 1, 2, 3))):
        if flag == "--trace-stages" and command == "repro":
            continue
        value = rng.choice(FLAG_VALUES[flag])
        if flag == "--inputs" and rng.random() < 0.3 and dumps:
            value = f"dump:{rng.choice(sorted(dumps.values()))}"
        argv += [flag, value]
        how.append(f"{flag} {value[:40]!r}")
    if command == "repro":
        argv += ["--out", str(directory / f"r{seed}")] + (["--no-reference"] if rng.random() < 0.9 else [])
    return argv, "; ".join(how) or "unmutated"


@contextlib.contextmanager
def no_build() -> Iterator[None]:
    """Building (a cubin or a launch library) or launching is where the checks must already be done:
    each stops with BUILD_STUB."""
    from harness.build import BuildError
    from oracle.run import live

    def stub(*args, **kwargs):
        raise BuildError(BUILD_STUB)

    saved = live.build_cubin, live.build_library, live.load_cubin, live.run_kernel, live.require_gpu
    live.build_cubin = live.build_library = live.load_cubin = live.run_kernel = stub
    live.require_gpu = lambda: None  # the GPU check comes after every check of the case, just before the build
    try:
        yield
    finally:
        live.build_cubin, live.build_library, live.load_cubin, live.run_kernel, live.require_gpu = saved


class Untyped(Exception):
    """The command ended in a traceback (exit 4) or printed a malformed error."""


def run_command(argv: list[str]) -> tuple[int, str]:
    """cli.main(argv) in this process: (exit code, stderr); Untyped when it failed as a defect."""
    from oracle.tools.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    text = err.getvalue()
    if code == 4 or "Traceback" in text:
        raise Untyped(f"exit {code}: {text[-1500:]}")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if code == 2 and argv[0] != "bench":
        if len(lines) != 1 or not lines[0].startswith("error: "):
            raise Untyped(f"exit 2 without one error line: {text[-600:]!r}")
    if argv[0] == "bench":  # a case that failed is a row "name: ErrorType: message"; its type must be documented
        from oracle.errors import documented_errors

        # and NoGpuError: no fault of the input, a live case on a machine without a GPU (exit 7 from compare)
        typed = {t.__name__ for t in documented_errors()} | {"NoGpuError"}
        for ln in lines:
            if ln.startswith(("error: ", "[")):  # a refusal of the whole list, or progress
                continue
            m = re.match(r"^\S+: (\w+): ", ln)
            if m is None or m.group(1) not in typed:
                raise Untyped(f"bench row with an undocumented error: {ln[:600]!r}")
    return code, text


def _run_guarded(tally: Tally, seed: int, argv: list[str], how: str) -> Optional[tuple[int, str]]:
    """run_command under the hang limit: (exit code, output), or None with the hang or the untyped
    error kept in the tally."""
    fired: list = []
    try:
        with time_limit(HANG_S) as fired:
            out = run_command(argv)
    except Exception as e:
        if fired or isinstance(e, Hang):  # the limit, however the command passed it on (exit 4 included)
            tally.hangs.append(seed)
        elif isinstance(e, Untyped):
            tally.untyped.append((seed, "Untyped", f"{' '.join(argv)[:300]} ({how})", str(e)))
        else:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-4:])
            tally.untyped.append((seed, type(e).__name__, f"{' '.join(argv)[:300]} ({how})", tb))
        return None
    if fired:
        tally.hangs.append(seed)
        return None
    return out


def _count_outcome(tally: Tally, code: int, text: str) -> None:
    """A command line that returned: the (stubbed) build reached, refused with exit 2, or another exit."""
    if BUILD_STUB in text:
        tally.accepted += 1
        tally.extra["reached the build"] += 1
    elif code == 2:
        tally.refused["error: (exit 2)"] += 1
    else:
        tally.accepted += 1
        tally.extra[f"exit {code}"] += 1


CASE_KINDS = dict({"bench list": r"^bench list$", "case replaced": r"^case replaced$",
                   "document edited": r"( replaced| removed| gained a key| gained an entry)$",
                   "grid entry": r"^grid\[\d\] = ", "literal": r"^a literal ", "tensormap option": r"^a tensormap with ",
                   "trace table": r"^trace table$", "kernel key": r"^a kernel key$", "extends": r"^extends = ",
                   "unmutated": r"^unmutated$"},
                  **{f"flag {f}": f"^{f} " for f in FLAG_VALUES})


def run_cases(count: int, seed0: int = 0, tally: Optional[Tally] = None) -> Tally:
    """Run `count` command lines around mutated case files and bench lists (build and launch
    stubbed): exit 2 with one `error:` line, or the build reached with every check passed."""
    tally = tally or Tally("case files and flags")
    t0 = time.perf_counter()
    corpus = dump_corpus()
    with tempfile.TemporaryDirectory(prefix="fuzz-cases-") as tmp, knobs(), no_build():
        directory = Path(tmp)
        dumps = {}
        for name, raw in corpus[:3]:  # recordings of other problems, as --inputs dump:PATH
            dumps[name] = directory / name.replace(".gz", "")
            dumps[name].write_bytes(raw)
        for seed in range(seed0, seed0 + count):
            argv, how = make_case(seed, directory, dumps)
            tally.inputs += 1
            count_kinds(tally, how, CASE_KINDS)
            outcome = _run_guarded(tally, seed, argv, how)
            if outcome is not None:
                _count_outcome(tally, *outcome)
    tally.seconds += time.perf_counter() - t0
    return tally


# ---------------------------------------------------------------------------------------------
# Case fields: partitions, batch, groups, workspaces, launch fields
# ---------------------------------------------------------------------------------------------

TRACE_MEMORY_EVERY = 6  # case-field runs whose allocations are traced (every n-th seed)
HUGE_INTS = (0, -1, 1, 2, 3, 7, 132, 1 << 16, (1 << 16) + 1, 1 << 20, (1 << 20) + 1, 2**31 - 1, 2**31, 2**32,
             2**40, 2**63 - 1, 10**30)


def _size(rng: random.Random) -> Any:
    """A size a case might give: mostly a boundary integer, sometimes an expression or a hostile value."""
    r = rng.random()
    if r < 0.6:
        return rng.choice(HUGE_INTS)
    if r < 0.8:
        return rng.choice(("m * n * 4", "tiles * splits * 4", "tiles * max_partials * 16384", "k_blocks * 2**20",
                           "m * n * k * 1000", "cdiv(m, 64) * 0", "-1", "total_m * n * 4", "groups * 8"))
    return hostile_value(rng)


def _field_edit(rng: random.Random, doc: dict, s: dict) -> tuple[str, str, Any]:
    """One edit of a new case field: (table, key, value); `s` is the problem table."""
    pick = rng.randrange(9)
    m = s.get("m", 40) if isinstance(s.get("m"), int) else 40
    if pick == 0:
        return "problem", "stream_k_workers", _size(rng)
    if pick == 1:
        return "problem", "splits", rng.choice((1, 2, 3, 5, 64, 2**31, 0, -1, 1.5, "2"))
    if pick == 2:
        return "problem", "batch", rng.choice((1, 2, 3, 1 << 16, (1 << 16) + 1, 2**31, 2**62, 0, -3, "4"))
    if pick == 3:
        kind = rng.randrange(6)
        if kind == 0:
            cut = rng.randrange(m + 1)
            g = [cut, m - cut]
        elif kind == 1:
            g = [1] * rng.choice((m, (1 << 16) + 1))
        elif kind == 2:
            g = [0, m, 0]
        elif kind == 3:
            g = [m, -1, 1]
        elif kind == 4:
            g = [2**31, m]
        else:
            g = hostile_value(rng)
        if isinstance(g, list) and len(g) > 1000:
            s["m"] = sum(g)
        return "problem", "groups", g
    if pick == 4:
        return "problem", rng.choice(("reduction", "reduction_chunk")), rng.choice(
            ("fp32", "bf16", "fp16", "none", "x", 16, 64, 0, -16, 2**40))
    if pick == 5:
        name = rng.choice(("ws", "w2", "bad name", "1x"))
        table = {"bytes": _size(rng)}
        if rng.random() < 0.5:
            table["init"] = rng.choice(("zero", "poison", "stale", "junk"))
        if rng.random() < 0.5:
            table["dtype"] = rng.choice(("uint8", "int32", "fp32", "fp64"))
        if rng.random() < 0.1:
            table = hostile_value(rng)
        doc.setdefault("workspace", {})[name] = table
        launch = doc.get("launch")
        if isinstance(launch, dict) and isinstance(launch.get("args"), list) and rng.random() < 0.7:
            launch["args"].append({"workspace": name})
        return "workspace", name, table
    launch = doc.setdefault("launch", {})
    if not isinstance(launch, dict):
        launch = doc["launch"] = {}
    key = rng.choice(("grid", "block", "cluster", "shared_mem_bytes", "next"))
    if key in ("grid", "block", "cluster"):
        value = [rng.choice((_size(rng), 1, 2)) for _ in range(rng.choice((1, 2, 3, 4)))]
    elif key == "shared_mem_bytes":
        value = _size(rng)
    else:
        value = [{"entry": rng.choice(("k2", "", 5)), "grid": [_size(rng)], "block": [rng.choice((1, 32, 2048))],
                  "args": rng.choice((["d"], ["a", {"workspace": "ws"}], [], 5))}
                 for _ in range(rng.choice((1, 2)))]
    launch[key] = value
    return "launch", key, value


def make_case_fields(seed: int, directory: Path) -> tuple[list[str], str]:
    """A command line around a case whose partition, batch, groups, workspaces or launch fields
    are mutated (in the TOML, or given with --set): (argv, how)."""
    rng = random.Random(seed)
    doc = _case_doc(rng.choice(BASE_CASES[:3]))
    s = doc.setdefault("problem", {})
    s.update(SMALL)
    how, sets = [], []
    for _ in range(rng.choice((1, 1, 2, 3))):
        table, key, value = _field_edit(rng, doc, s)
        how.append(f"{table}.{key} = {shown(value)}")
        if table == "problem" and rng.random() < 0.25 and not (isinstance(value, list) and len(value) > 100):
            s.pop(key, None)
            sets.append(f"{key}={_toml_value(value)}")
        elif table == "problem":
            s[key] = value
    path = directory / f"f{seed}.toml"
    path.write_text(toml_text(doc))
    argv = ["compare", "--problem", str(path), "--inputs", rng.choice(("ones", "random:1")), "--allow-outside-case-dir"]
    for item in sets:
        argv += ["--set", item]
    return argv, "; ".join(how)


def shown(v: Any) -> str:
    from harness.fields import shown as _shown

    return _shown(v)[:80]


FIELD_KINDS = {"stream-K workers": r"^problem\.stream_k_workers = ", "splits": r"^problem\.splits = ",
               "batch": r"^problem\.batch = ", "groups": r"^problem\.groups = ",
               "reduction": r"^problem\.reduction = ", "reduction chunk": r"^problem\.reduction_chunk = ",
               "workspace": r"^workspace\.", "grid": r"^launch\.grid = ", "block": r"^launch\.block = ",
               "cluster": r"^launch\.cluster = ", "shared memory": r"^launch\.shared_mem_bytes = ",
               "next launches": r"^launch\.next = "}


def run_case_fields(count: int, seed0: int = 0, tally: Optional[Tally] = None) -> Tally:
    """Run `count` command lines around cases with mutated new fields (build and launch stubbed):
    exit 2 with one `error:` line, or the build reached with every check passed; each in bounded
    time and within the memory limits (a traced peak past them is a breach)."""
    tally = tally or Tally("case fields")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-fields-") as tmp, knobs(), no_build():
        directory = Path(tmp)
        for seed in range(seed0, seed0 + count):
            argv, how = make_case_fields(seed, directory)
            tally.inputs += 1
            count_kinds(tally, how, FIELD_KINDS)
            traced = seed % TRACE_MEMORY_EVERY == 0  # tracing slows a run several times: one in a few
            if traced:
                tracemalloc.start()
            try:
                outcome = _run_guarded(tally, seed, argv, how)
            finally:
                peak = tracemalloc.get_traced_memory()[1] if traced else 0
                if traced:
                    tracemalloc.stop()
            if outcome is None:
                continue
            if peak > (2 * LIMIT_MB + 64) << 20:
                tally.breaches.append((seed, f"{how}: {peak} bytes traced"))
            _count_outcome(tally, *outcome)
    tally.seconds += time.perf_counter() - t0
    return tally


# ---------------------------------------------------------------------------------------------
# oracle.check arguments
# ---------------------------------------------------------------------------------------------

CHECK_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int8", "float64", "int32",
                "bool", "complex64", "uint8")
EXTREMES = ("nan", "inf", "-inf", "max", "-max", "tiny", "zero")


def _check_tensor(rng: random.Random, shape: tuple[int, ...], dtype_name: str) -> Any:
    """A tensor for an argument of oracle.check: usually of `dtype_name` on the CPU, sometimes on
    the meta device, sparse, of another shape, with NaN / Inf / extreme values, or not a tensor."""
    import torch

    r = rng.random()
    if r < 0.04:
        return hostile_value(rng)
    dtype = getattr(torch, rng.choice(CHECK_DTYPES) if r < 0.12 else dtype_name)
    if r < 0.18:
        shape = tuple(max(0, d + rng.choice((-1, 1, 3))) for d in shape) or (2,)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if rng.random() < 0.3 and x.numel():
        finfo = torch.finfo(dtype) if dtype.is_floating_point else None
        for _ in range(rng.choice((1, 2, 5))):
            e = rng.choice(EXTREMES)
            v = {"nan": float("nan"), "inf": float("inf"), "-inf": -float("inf"), "zero": 0.0,
                 "max": finfo.max if finfo else 127.0, "-max": -finfo.max if finfo else -127.0,
                 "tiny": finfo.tiny if finfo else 1.0}[e]
            if rng.random() < 0.3:
                x.fill_(v)
            else:
                x.view(-1)[rng.randrange(x.numel())] = v
    if dtype in (torch.int8, torch.int32, torch.uint8, torch.bool):
        x = x.clamp(-8, 8).nan_to_num(0.0).round()
    try:
        t = x.to(dtype)
    except (RuntimeError, TypeError):
        t = x.float()
    r = rng.random()
    if r < 0.04:
        t = t.to("meta")
    elif r < 0.06 and t.dim() == 2 and not t.dtype.is_complex:
        try:
            t = t.float().to_sparse()
        except RuntimeError:
            pass
    elif r < 0.1 and t.dim() == 2:
        t = t.t().contiguous().t()  # column-major strides
    return t


def _plain(t: Any) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.layout is torch.strided and t.device.type == "cpu" and t.dim() == 2 \
        and not t.is_complex() and t.dtype != torch.bool


def make_check_call(seed: int) -> tuple[tuple, dict, str]:
    """Arguments for oracle.check: random shapes and dtypes, optional C, bias and scales, keyword
    fields with huge or non-finite scalars; (args, kwargs, how)."""
    rng = random.Random(seed)
    m, n, k = rng.choice((1, 2, 8, 17, 33)), rng.choice((1, 3, 8, 24)), rng.choice((1, 4, 16, 40))
    dt = rng.choice(("bfloat16", "bfloat16", "float16", "float32", "float8_e4m3fn", "int8"))
    out = rng.choice(("bfloat16", "float32", "float16", dt if dt != "int8" else "int32"))
    a, b, d = _check_tensor(rng, (m, k), dt), _check_tensor(rng, (k, n), dt), _check_tensor(rng, (m, n), out)
    if rng.random() < 0.6 and all(_plain(t) for t in (a, b, d)) and a.shape[1] == b.shape[0]:
        d = (a.double() @ b.double()).to(d.dtype) if d.dtype.is_floating_point else d  # a right answer
    kw: dict[str, Any] = {"tile": (16, 16, 16)}  # small tiles: the interpreter's time grows with them
    how = [f"{m}x{n}x{k} {dt}->{out}"]
    for name, shape in (("c", (m, n)), ("bias", (n,)), ("scale_a", (1,)), ("scale_b", (n,))):
        if rng.random() < 0.15:
            kw[name] = _check_tensor(rng, shape, "float32")
            how.append(name)
    scalars = (1.0, 0.5, -2.0, 0, 3, 2**70, -(2**70), 1e30, 1e38, 3.4e38, 1e39, 1e308, float("nan"), float("inf"),
               -float("inf"), True, "2", None, [1.0], 10**400)
    for name in ("alpha", "beta"):
        if rng.random() < 0.25:
            kw[name] = rng.choice(scalars)
            how.append(f"{name}={shown(kw[name])}")
    if rng.random() < 0.15:
        key = rng.choice(("tile", "splits", "stream_k_workers", "acc_model", "activation", "bias_axis", "saturate",
                          "reduction", "bogus", "batch", "groups"))
        kw[key] = rng.choice(((16, 16, 16), (64, 64), [8, 8, 8, 8], 2, 3, 2**31, "any", "gelu_erf", "row", True,
                              "fp32", 0, -1, hostile_value(rng)))
        how.append(f"{key}={shown(kw[key])}")
    return (a, b, d), kw, "; ".join(how)


CHECK_KINDS = dict({f"{dt} operands": f"^\\d+x\\d+x\\d+ {dt}->" for dt in
                    ("bfloat16", "float16", "float32", "float8_e4m3fn", "int8")},
                   **{name: f"^{name}$" for name in ("c", "bias", "scale_a", "scale_b")},
                   **{name: f"^{name}=" for name in ("alpha", "beta")},
                   **{"another keyword": r"^(tile|splits|stream_k_workers|acc_model|activation|bias_axis|saturate|"
                                         r"reduction|bogus|batch|groups)="})


def run_check_calls(count: int, seed0: int = 0, judge_every: int = 1, tally: Optional[Tally] = None) -> Tally:
    """Call oracle.check `count` times with generated arguments: a documented error or a report.
    With judge_every n > 1, the arguments of every call are checked (oracle.tools.api.recording_of, every
    refusal `check` makes before judging) and every n-th call that passes is judged in full. A
    valid input judged ORACLE_UNTRUSTED is a defect (kept with its seed, like an untyped error)."""
    import oracle
    from oracle.tools.api import recording_of

    return _run_calls(tally or Tally("oracle.check calls"), count, seed0, judge_every, make_check_call, CHECK_KINDS,
                      recording_of, oracle.check)


def _run_calls(tally: Tally, count: int, seed0: int, judge_every: int, make_call, kinds, checked, judged) -> Tally:
    """`count` generated calls from seed0 on: `checked(*args, **kw)` (the refusals made before judging) for
    each, `judged(*args, **kw)` (the full call) for every judge_every-th that passes; untyped errors and
    ORACLE_UNTRUSTED verdicts are kept with their seeds."""
    from oracle.errors import input_errors

    typed = input_errors()
    t0 = time.perf_counter()
    valid = 0
    with knobs():
        for seed in range(seed0, seed0 + count):
            args, kw, how = make_call(seed)
            count_kinds(tally, how, kinds)
            rec = _record(tally, seed, lambda: checked(*args, **kw), typed)
            if rec is None:
                continue
            valid += 1
            if valid % judge_every:
                tally.extra["valid, not judged"] += 1
                continue
            tally.accepted -= 1  # counted again by the full call
            tally.inputs -= 1
            rep = _record(tally, seed, lambda: judged(*args, **kw), typed)
            if rep is not None:
                tally.extra[f"verdict {rep.verdict}"] += 1
                if rep.verdict == "ORACLE_UNTRUSTED":
                    tally.untyped.append((seed, "ORACLE_UNTRUSTED", how, "; ".join(rep.analysis.cross_check)[:600]))
    tally.seconds += time.perf_counter() - t0
    return tally


def _attention_answer(q, k, v, causal: bool):
    """O and LSE of plain FlashAttention-layout tensors in float64 (the right answer), or None."""
    import torch

    b, sq, hq, d = q.shape
    hk = k.shape[2]
    if hk == 0 or hq % hk:
        return None
    qq = q.double().permute(0, 2, 1, 3)
    kk = k.double().permute(0, 2, 1, 3).repeat_interleave(hq // hk, 1)
    vv = v.double().permute(0, 2, 1, 3).repeat_interleave(hq // hk, 1)
    s = qq @ kk.transpose(-1, -2) / math.sqrt(d)
    if causal:  # bottom-right, as check_attention's causal=True
        sk = k.shape[1]
        i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), -math.inf)
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vv
    return o.permute(0, 2, 1, 3), lse.float()


def make_attention_check_call(seed: int) -> tuple[tuple, dict, str]:
    """Arguments for oracle.check_attention: FlashAttention-layout tensors of random shapes and dtypes
    (sometimes the right O and LSE), hostile masks, windows, scales, soft-caps, variable lengths, page
    tables and keyword fields; (args, kwargs, how)."""
    import torch

    rng = random.Random(seed)
    b, hk = rng.choice((1, 2)), rng.choice((1, 2))
    hq = hk * rng.choice((1, 2)) if rng.random() < 0.85 else rng.choice((1, 3, 5))
    sq, sk, d = rng.choice((1, 5, 17, 40)), rng.choice((1, 7, 33, 64)), rng.choice((8, 16, 16, 24))
    dt = rng.choice(("bfloat16", "bfloat16", "float16", "float32", "float8_e4m3fn", "int8"))
    q, k, v = (_check_tensor(rng, shape, dt) for shape in ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d)))
    o = _check_tensor(rng, (b, sq, hq, d), rng.choice((dt, "bfloat16", "float32")))
    lse = _check_tensor(rng, (b, hq, sq), "float32") if rng.random() < 0.5 else None
    how = [f"{b}x{hq}/{hk}x{sq}x{sk}x{d} {dt}"]
    causal = rng.choice((False, False, True, "top_left", "bottom_right", "diagonal", 1, None, hostile_value(rng)))
    plain = all(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout is torch.strided
                and t.is_floating_point() for t in (q, k, v, o))
    if plain and rng.random() < 0.6 and causal in (False, True) and q.shape[3] == k.shape[3] == v.shape[3]:
        right = _attention_answer(q, k, v, causal)
        if right is not None and tuple(o.shape) == tuple(right[0].shape):
            o = right[0].to(o.dtype)
            lse = right[1] if lse is not None and rng.random() < 0.8 else lse
            how.append("the right O")
    kw: dict[str, Any] = {"block_q": 16, "block_kv": 16}  # small blocks: the interpreter's time grows with them
    if causal is not False:
        kw["causal"] = causal
        how.append(f"causal={shown(causal)}")
    extras = {"window": ((-1, -1), (4, 0), (0, -1), (-5, 2), (2**40, 1), "x", (1, 2, 3), None),
              "softmax_scale": (0.1, 0.0, -1.0, float("nan"), float("inf"), 1e30, "2", None),
              "softcap": (30.0, 0.0, -1.0, float("nan"), float("inf"), 1e-30),
              "cu_seqlens_q": ("valid", (0, 3, 2), (0, 2**40), "not a tensor"),
              "cu_seqlens_k": ("valid", (0, 9, 1), (1, 2), "not a tensor"),
              "page_table": ((0, 1), (-1, 0), (2**31, 0), "not a tensor"),
              "splits": (2, 0, -1, 2**31, "2"), "block_q": (0, 3, 64, 2**20, "16"), "block_kv": (0, 5, 128, -16),
              "descale_q": (0.5, float("nan"), -1.0, 0.0), "p_scale": (2.0, 0.0, float("inf")),
              "empty_lse": ("+inf", "-inf", "zero", 0), "head_dim_v": (8, 0), "bogus": (1, "x")}
    for name in rng.sample(sorted(extras), rng.choice((0, 0, 1, 1, 2, 3))):
        value = rng.choice(extras[name])
        if name.startswith("cu_seqlens") and value == "valid":
            lens = [rng.choice((1, 3, 5)) for _ in range(b)]
            value = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(b)], dtype=torch.int32)
        elif isinstance(value, tuple) and name in ("cu_seqlens_q", "cu_seqlens_k", "page_table"):
            value = torch.tensor([value] if name == "page_table" else value, dtype=torch.int64)
        kw[name] = value
        how.append(f"{name}={shown(value)[:40]}")
    return (q, k, v, o, lse), kw, "; ".join(how)


ATTENTION_CHECK_KINDS = dict({f"{dt} operands": f"^\\d+x\\d+/\\d+x\\d+x\\d+x\\d+ {dt}$" for dt in
                              ("bfloat16", "float16", "float32", "float8_e4m3fn", "int8")},
                             **{"the right O": "^the right O$", "causal": "^causal=",
                                "a keyword field": r"^(window|softmax_scale|softcap|cu_seqlens_q|cu_seqlens_k|"
                                                   r"page_table|splits|block_q|block_kv|descale_q|p_scale|"
                                                   r"empty_lse|head_dim_v|bogus)="})


def run_attention_check_calls(count: int, seed0: int = 0, judge_every: int = 1,
                              tally: Optional[Tally] = None) -> Tally:
    """Call oracle.check_attention `count` times with generated arguments: a documented error or a
    report. With judge_every n > 1, every call's arguments are checked (attention_recording_of: every
    refusal check_attention makes before judging) and every n-th call that passes is judged in full;
    a valid input judged ORACLE_UNTRUSTED is a defect."""
    import oracle
    from oracle.tools.api import attention_recording_of

    return _run_calls(tally or Tally("oracle.check_attention calls"), count, seed0, judge_every,
                      make_attention_check_call, ATTENTION_CHECK_KINDS, attention_recording_of, oracle.check_attention)


# ---------------------------------------------------------------------------------------------
# Reproducer folders
# ---------------------------------------------------------------------------------------------

REPRO_READ = ("repro.json", "result.txt", "d.bin", "a.bin", "b.bin")  # what compare --repro-dir reads
REPRO_FILES = REPRO_READ + ("manifest.json", "launch.txt", "inputs.txt", "README.txt", "Makefile", "bias.bin",
                            "kernel", "kernel/src/simple_gemm.cu", "sink.bin")


def _repro_base(directory: Path):
    """A reproducer of simple_gemm (small, ones) as a clean untraced run leaves it, its case and inputs."""
    from oracle.run.case import load_case
    from oracle.run.inputs import Provenance, make_operands
    from oracle.repro.generate import write_repro

    case = load_case(str(ROOT / "harness/examples/simple_gemm.toml"), SMALL)
    ops = make_operands(case.spec, "ones", 0)
    base = directory / "base"
    write_repro(case, ops, Provenance("ones", None), base, reference=False)
    (base / "result.txt").write_text("status ok\ntraced 0\n")
    (base / "d.bin").write_bytes(bytes(2 * SMALL["m"] * SMALL["n"]))
    return base, case, ops


def _snapshot(d: Path) -> dict:
    """Every entry under d, links not followed: its kind and bytes (or link target)."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(d))] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p.relative_to(d))] = ("file", p.read_bytes() if p.stat().st_size < 1 << 24 else p.stat().st_size)
        elif p.is_dir():
            out[str(p.relative_to(d))] = ("dir",)
        else:
            out[str(p.relative_to(d))] = ("other",)
    return out


def _mutate_repro(rng: random.Random, d: Path, outside: Path) -> tuple[list[str], bool]:
    """1 to 3 mutations of the folder d; (what was done, whether a file the reader reads became a link)."""
    how, linked = [], False
    for _ in range(rng.choice((0, 1, 1, 2, 3))):  # 0: the oracle's own folder, which a new write replaces
        pick = rng.choice((0, 0, 1, 2, 3, 4, 5, 6, 7))
        name = rng.choice(REPRO_FILES)
        p = d / name
        if not os.path.realpath(p.parent).startswith(os.path.realpath(d)):
            continue  # kernel/ is a link already: the mutation itself must not reach through it
        if pick == 0:  # a file (or kernel/) replaced by a symbolic link out of the folder
            target = rng.choice([outside / "victim.bin", outside, Path("/proc/self/environ"), Path("/dev/zero"),
                                 d / "a.bin", Path("/nonexistent")])
            if name in REPRO_READ and p.is_file() and not p.is_symlink() and rng.random() < 0.6:
                target = outside.parent / "copies" / f"{len(how)}_{name}"  # the same bytes, elsewhere
                target.parent.mkdir(exist_ok=True)
                target.write_bytes(p.read_bytes())
            if p.is_dir() and not p.is_symlink():
                import shutil
                shutil.rmtree(p)
            elif os.path.lexists(p):
                p.unlink()
            p.symlink_to(target)
            linked |= name in REPRO_READ
            how.append(f"{name} -> {target}")
        elif pick == 1:  # a file the oracle did not write
            extra = d / rng.choice(["notes.txt", "kernel/src/extra.cuh", "x.bin", ".hidden", "kernel/new/y"])
            inside = os.path.realpath(extra.parent).startswith(os.path.realpath(d))  # never through a link of its own
            if inside and not os.path.lexists(extra.parent):
                try:
                    extra.parent.mkdir(parents=True)
                except (NotADirectoryError, FileExistsError):  # an earlier mutation left a file where a folder was
                    pass
            if inside and extra.parent.is_dir() and not os.path.lexists(extra):
                extra.write_bytes(rng.randbytes(rng.randrange(64)))
                how.append(f"extra {extra.relative_to(d)}")
        elif pick == 2:  # the manifest edited
            m = d / "manifest.json"
            if m.is_file() and not m.is_symlink():
                try:
                    doc = json.loads(m.read_text())
                    doc, what = _edit(rng, doc, json_only=True)
                    m.write_text(json.dumps(doc))
                except (ValueError, RecursionError):
                    what = "not JSON"
                if rng.random() < 0.3:
                    m.write_bytes(m.read_bytes()[:rng.randrange(1, 200)])
                    what += ", truncated"
                how.append(f"manifest: {what}")
        elif pick == 3:  # a tensor file cut, grown (sparse, up to 3 GiB) or overwritten
            t = d / rng.choice(["a.bin", "b.bin", "d.bin", "bias.bin", "sink.bin"])
            if not os.path.lexists(t) or t.is_file() and not t.is_symlink():
                size = rng.choice([0, 1, 7, 100, 2 * SMALL["m"] * SMALL["k"] - 1, 2 * SMALL["m"] * SMALL["k"] + 2,
                                   1 << 20, 3 << 30])
                with open(t, "ab") as f:
                    f.truncate(size)
                how.append(f"{t.name} is {size} bytes")
        elif pick == 4:  # repro.json edited (a tensor's claimed storage_shape among the favourites)
            r = d / "repro.json"
            if r.is_file() and not r.is_symlink():
                doc = json.loads(r.read_text())
                if rng.random() < 0.4 and isinstance(doc.get("tensors"), dict) and doc["tensors"]:
                    meta = doc["tensors"][rng.choice(sorted(doc["tensors"]))]
                    if isinstance(meta, dict):
                        meta[rng.choice(["storage_shape", "shape"])] = rng.choice(
                            [[2**40, 2**40], [0], [1, 1, 1, 1], [-1, 5], [3 << 29, 1], [SMALL["m"] * 2, SMALL["k"]]])
                        what = "a tensor's shape claimed"
                else:
                    doc, what = _edit(rng, doc, json_only=True)
                r.write_text(json.dumps(doc))
                how.append(f"repro.json: {what}")
        elif pick == 5:  # a text file's lines broken (launch.txt, inputs.txt, result.txt)
            t = d / rng.choice(["launch.txt", "inputs.txt", "result.txt", "problem.txt"])
            if t.is_file() and not t.is_symlink():
                lines = t.read_text(errors="replace").splitlines()
                i = rng.randrange(len(lines)) if lines else 0
                junk = rng.choice(["entry_traced k\ncubin_traced ../../x", "\r", "\x00", "status ok extra",
                                   "file=../../etc/passwd", "$(shell touch PWNED)", "tensor name=a file=/dev/zero",
                                   "status kernel_error", "launch 7", "arg bytes zz"])
                if rng.random() < 0.5 or not lines:
                    lines.insert(i, junk)
                else:
                    lines[i] += junk
                t.write_text("\n".join(lines) + "\n")
                how.append(f"{t.name}: {junk!r} at line {i}")
        elif pick == 7:  # what a build and a run leave: the folder is still the oracle's own
            for out in rng.sample(["repro", "repro_traced", "kernel.cubin", "d.bin", "sink.bin", "result.txt"], 2):
                if not os.path.lexists(d / out) or (d / out).is_file() and not (d / out).is_symlink():
                    (d / out).write_bytes(rng.randbytes(rng.randrange(256)))
            how.append("build outputs")
        else:  # a fifo or a folder where a file was
            if os.path.lexists(p) and not p.is_dir():
                p.unlink()
                if rng.random() < 0.5:
                    os.mkfifo(p)
                    how.append(f"{name} is a fifo")
                else:
                    p.mkdir()
                    how.append(f"{name} is a folder")
    return how, linked


REPRO_KINDS = {"link out": r" -> ", "extra file": r"^extra ", "manifest edited": r"^manifest: ",
               "tensor file resized": r"\.bin is \d+ bytes$", "repro.json edited": r"^repro\.json: ",
               "text line broken": r"\.txt: .* at line \d+$", "build outputs": r"^build outputs$",
               "fifo": r" is a fifo$", "folder": r" is a folder$", "unmutated": r"^$"}


def run_repro_dirs(count: int, seed0: int = 0, tally: Optional[Tally] = None) -> Tally:
    """Mutate a reproducer folder `count` times; each is read back (compare --repro-dir's reader:
    ReproError, TraceFormatError or another documented type, never a link followed) and written
    into again (`repro --out`: accepted only as the oracle's own folder, else ReproError with not
    a byte changed); the files outside the folder that its links point to never change."""
    import shutil

    from oracle.errors import input_errors
    from oracle.repro.generate import write_repro
    from oracle.repro.readback import load_repro_run

    typed = input_errors()
    tally = tally or Tally("reproducer folders")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-repro-") as tmp, knobs():
        directory = Path(tmp)
        base, case, ops = _repro_base(directory)
        outside = directory / "outside"
        outside.mkdir()
        (outside / "victim.bin").write_bytes(bytes(2 * SMALL["m"] * SMALL["n"]))
        guarded = _snapshot(outside)
        from oracle.run.inputs import Provenance

        for seed in range(seed0, seed0 + count):
            rng = random.Random(seed)
            d = directory / "case"
            if os.path.lexists(d):
                shutil.rmtree(d)
            shutil.copytree(base, d, symlinks=True)
            how, linked = _mutate_repro(rng, d, outside)
            count_kinds(tally, "; ".join(how), REPRO_KINDS)
            rec = _record(tally, seed, lambda: load_repro_run(d), typed)
            if rec is not None and linked:
                tally.breaches.append((seed, f"read through a link: {'; '.join(how)}"))
            before = _snapshot(d)
            written = Tally("write")
            out = _record(written, seed, lambda: write_repro(case, ops, Provenance("ones", None), d, reference=False),
                          typed)
            tally.untyped += written.untyped
            tally.hangs += written.hangs
            tally.extra["written again"] += out is not None
            tally.extra.update({f"write refused: {k}": v for k, v in written.refused.items()})
            if out is None and not written.untyped and _snapshot(d) != before:
                tally.breaches.append((seed, f"a refused write changed the folder: {'; '.join(how)}"))
            if out is None and all(h == "build outputs" for h in how) and not written.untyped:
                tally.breaches.append((seed, f"the oracle's own folder was refused: {'; '.join(how) or 'unmutated'}"))
            if out is not None and any(v[0] == "link" for v in before.values()):
                tally.breaches.append((seed, f"wrote into a folder holding a link: {'; '.join(how)}"))
            if _snapshot(outside) != guarded:
                tally.breaches.append((seed, f"a file outside the folder changed: {'; '.join(how)}"))
                shutil.rmtree(outside)
                outside.mkdir()
                (outside / "victim.bin").write_bytes(bytes(2 * SMALL["m"] * SMALL["n"]))
    tally.seconds += time.perf_counter() - t0
    return tally


# ---------------------------------------------------------------------------------------------
# The long campaign
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The warm server's protocol
# ---------------------------------------------------------------------------------------------

SERVER_KINDS = {"hostile field": r"^field ", "bytes flipped": r"^bytes flipped", "cut short": r"^cut short",
                "nested": r"^nested", "huge": r"^huge", "not json": r"^not json", "unmutated": r"^unmutated$"}


def make_request(seed: int) -> tuple[bytes, str]:
    """One request line for the server: a valid one mutated (a field replaced by a hostile value,
    bytes flipped, cut short, nested deep, made huge, or not JSON at all): (bytes, how)."""
    rng = random.Random(seed)
    doc = {"argv": ["knobs"], "cwd": "/", "env": {"ORACLE_DEVICE": "cpu"}}
    pick = rng.randrange(8)
    if pick == 0:
        return json.dumps(doc).encode(), "unmutated"
    if pick in (1, 2):
        key = rng.choice(("argv", "cwd", "env", "extra"))
        doc[key] = hostile_value(rng, json_only=True)
        if rng.random() < 0.3 and isinstance(doc.get("argv"), list):
            doc["argv"] = [hostile_value(rng, json_only=True) for _ in range(rng.randrange(4))]
        return json.dumps(doc, default=str).encode(), f"field {key}"
    raw = bytearray(json.dumps(doc).encode())
    if pick == 3:
        for _ in range(rng.randrange(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw), "bytes flipped"
    if pick == 4:
        return bytes(raw[:rng.randrange(len(raw))]), "cut short"
    if pick == 5:
        depth = rng.choice((5, 50, 5000, 200000))
        return ("[" * depth + "]" * depth).encode() if rng.random() < 0.5 else \
            json.dumps({"argv": ["knobs"], "cwd": "/", "env": {"ORACLE_X": "[" * depth}}).encode(), "nested"
    if pick == 6:
        return json.dumps({"argv": ["knobs", "x" * rng.choice((1 << 10, 1 << 17, 1 << 21))], "cwd": "/"}).encode(), \
            "huge"
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))), "not json"


def run_server_requests(count: int, seed0: int = 0, tally: Optional[Tally] = None) -> Tally:
    """Check `count` mutated request lines as the server does; BadRequest is the only acceptable
    refusal, and what is accepted is a well-formed request."""
    from oracle.tools.server import BadRequest, parse_request

    tally = tally or Tally("server requests")
    t0 = time.perf_counter()
    for seed in range(seed0, seed0 + count):
        data, how = make_request(seed)
        req = _record(tally, seed, lambda: parse_request(data), (BadRequest,))
        if req is not None and not (req.argv and all(isinstance(a, str) for a in req.argv)):
            tally.breaches.append((seed, f"accepted a malformed request ({how})"))
        count_kinds(tally, how, SERVER_KINDS)
        if how == "unmutated" and req is None:
            tally.extra["unmutated refused"] += 1
    tally.seconds += time.perf_counter() - t0
    return tally


def main(argv: Optional[list[str]] = None) -> int:
    import argparse
    import resource

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=int, default=12000)
    p.add_argument("--dumps", type=int, default=2400)
    p.add_argument("--cases", type=int, default=400)
    p.add_argument("--case-fields", type=int, default=600)
    p.add_argument("--check-calls", type=int, default=1000)
    p.add_argument("--judge-every", type=int, default=1, help="judge every n-th oracle.check call that is valid")
    p.add_argument("--attention-calls", type=int, default=0, help="oracle.check_attention calls (judged as --judge-every)")
    p.add_argument("--repro-dirs", type=int, default=300)
    p.add_argument("--server-requests", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1_000_000, help="the first seed (the CPU tier starts at 0)")
    p.add_argument("--analyze-every", type=int, default=8, help="judge every n-th dump that loads")
    p.add_argument("--as-limit-gb", type=float, default=4.0, help="the address-space limit (RLIMIT_AS)")
    p.add_argument("--json", help="write the counts here")
    p.add_argument("--entries", help="add the case-field and check-call tallies to this results file as its "
                   "'case_fields' and 'check_calls' entries (its other keys are kept)")
    args = p.parse_args(argv)
    limit = int(args.as_limit_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch  # noqa: F401  (imported under the limit, as everything after it)

    t0 = time.perf_counter()
    campaigns = ((run_traces, args.traces, {}), (run_dumps, args.dumps, {"analyze_every": args.analyze_every}),
                 (run_cases, args.cases, {}), (run_case_fields, args.case_fields, {}),
                 (run_check_calls, args.check_calls, {"judge_every": args.judge_every}),
                 (run_repro_dirs, args.repro_dirs, {}), (run_server_requests, args.server_requests, {}),
                 (run_attention_check_calls, args.attention_calls, {"judge_every": args.judge_every}))
    tallies = []
    for run, count, kw in campaigns:
        tallies.append(run(count, args.seed, **kw))
        print(json.dumps(tallies[-1].to_json()), flush=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    import platform

    doc = {"schema": "oracle.fuzz_inputs/1", "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, no GPU "
           f"(TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')})", "first_seed": args.seed,
           "address_space_limit_bytes": limit,
           "knobs": KNOBS, "hang_s": HANG_S, "wall_s": round(time.perf_counter() - t0, 1),
           "max_rss_bytes": usage.ru_maxrss * 1024, "python": sys.version.split()[0],
           "tallies": [t.to_json() for t in tallies],
           "untyped": sum(len(t.untyped) for t in tallies), "hangs": sum(len(t.hangs) for t in tallies),
           "limit_breaches": sum(len(t.breaches) for t in tallies)}
    from benchmarks import provenance

    doc[provenance.KEY] = provenance.stamp(
        __file__, argv, seeds={"first_seed": args.seed,
                               "inputs": "first_seed, first_seed + 1, ... in each campaign (make_trace(seed), ...)"},
        peer=provenance.NotApplicable("counts of typed refusals, untyped errors, hangs and limit breaches"),
        timing=provenance.NotApplicable("nothing is timed but the campaign's wall_s and the hang limit"))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if args.entries:
        path = Path(args.entries)
        results = json.loads(path.read_text()) if path.exists() else {}
        common = {k: doc[k] for k in ("machine", "first_seed", "address_space_limit_bytes", "knobs", "hang_s", "python",
                                      provenance.KEY)}
        for key, tally in (("case_fields", tallies[3]), ("check_calls", tallies[4])):
            results[key] = dict(common, **tally.to_json(), **({"judge_every": args.judge_every}
                                                               if key == "check_calls" else {}))
        path.write_text(json.dumps(results, indent=1) + "\n")
    for t in tallies:
        if not t.clean:
            print(t.failures(), file=sys.stderr)
    print(json.dumps({k: doc[k] for k in ("wall_s", "untyped", "hangs", "limit_breaches", "max_rss_bytes")}))
    return 0 if all(t.clean for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
