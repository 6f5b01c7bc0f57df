"""How a partitioned problem splits each tile's k-blocks into partials (the declared rules, and the
partition read from the kernel's own taps), and how a grouped or batched problem splits into its
GEMMs.

Declared rules (`ProblemSpec.partition`; `splits` = S deals a tile's KB k-blocks to S splits,
`stream_k_workers` = W deals the T = tiles x KB iterations, tiles row-major over the tile grid and
k-blocks in order, to W workers; share s of N items over P takers is):
- `ceil_shares`: [s * ceil(N / P), min(N, (s + 1) * ceil(N / P))), the last one shorter (the
  split-K default);
- `floor_shares`: [floor(s N / P), floor((s + 1) N / P)) (the stream-K default);
- `cutlass_stream_k`: floor(N / P) each and one more for the first N mod P takers (CUTLASS's
  stream-K "big blocks", 2.x threadblock swizzle and the SM90 tile scheduler alike);
- `stream_k_dp_remainder` (stream-K only): the last max(0, T_tiles // W - 1) * W tiles are done
  data-parallel, one whole tile each, and the first ones (the last full wave plus the partial
  wave) are dealt out stream-K by `cutlass_stream_k` (CUTLASS 2.x's hybrid, without its
  profitability heuristic, occupancy or cohort rasterisation).
A share left empty is no partial; the piece of a tile one taker has is a partial, numbered 0, 1, ...
in k order within the tile. Every rule is computed in O(partials), whatever W is.

Observed partitions (`observed_partition`): the kernel's mma taps name their partial and k-block,
so each traced tile's partials are read from them and checked (in k order, disjoint, covering every
k-block the trace recorded); the declared rule only places boundaries between k-blocks that were
not tapped. An overlap or a gap is a `PartitionIssue`, the differential's finding at mma. A tile
whose taps name no partial (`-1` in the trace) is whole. A boundary placed where k-blocks were not
traced (the k-block selection left them out) is assumed, not observed: an `AssumedBoundary`, which
every comparison resting on it carries as an open confound (oracle.judging.differential). A
recorded k-block that no partial tapped is a gap; one that was not recorded never is.

Groups: group g of a grouped problem covers rows [offset_g, offset_g + M_g) of A and D and uses
B[g]; a batched problem is `batch` groups of M rows each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from oracle.problem.spec import PARTITION_RULES, ProblemSpec

STREAM_K_ONLY = ("stream_k_dp_remainder",)


@dataclass(frozen=True)
class Partial:
    index: int  # 0, 1, ... in k order within the tile
    kb_begin: int
    kb_end: int  # exclusive

    def holds(self, kb: int) -> bool:
        return self.kb_begin <= kb < self.kb_end

    def describe(self) -> str:
        return f"partial {self.index} (k-blocks {self.kb_begin}-{self.kb_end - 1})"


@dataclass(frozen=True)
class _Deal:
    """`n` items dealt to `takers` by `rule`: the share of each taker and the taker of each item, O(1)."""

    n: int
    takers: int
    rule: str

    def begin(self, w: int) -> int:
        n, p = self.n, self.takers
        if self.rule == "ceil_shares":
            return min(n, w * -(-n // p))
        if self.rule == "floor_shares":
            return w * n // p
        q, r = divmod(n, p)  # cutlass_stream_k
        return w * q + min(w, r)

    def owner(self, i: int) -> int:
        """The taker of item i (0 <= i < n)."""
        n, p = self.n, self.takers
        if self.rule == "ceil_shares":
            return i // -(-n // p)
        if self.rule == "floor_shares":
            return ((i + 1) * p - 1) // n
        q, r = divmod(n, p)
        return i // (q + 1) if i < r * (q + 1) else r + (i - r * (q + 1)) // q

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The non-empty pieces of [lo, hi) the takers hold, in order: one step per piece."""
        out, i = [], lo
        while i < hi:
            e = min(hi, self.begin(self.owner(i) + 1))
            out.append((i, e))
            i = e
        return out


def deal(n: int, takers: int, rule: str, lo: int = 0, hi: Optional[int] = None) -> list[tuple[int, int]]:
    """The pieces of items [lo, hi) (default: all n) that `takers` hold when n items are dealt to
    them by `rule` (ceil_shares, floor_shares, cutlass_stream_k), in order; O(pieces)."""
    return _Deal(n, takers, rule).pieces(lo, n if hi is None else hi)


def default_rule(spec: ProblemSpec) -> str:
    """The rule the problem declares: `partition`, else ceil shares for split-K, floor shares for stream-K."""
    if spec.partition is not None:
        return spec.partition
    return "floor_shares" if spec.stream_k_workers is not None else "ceil_shares"


def rules_for(spec: ProblemSpec) -> tuple[str, ...]:
    """The named rules that apply to the problem's kind of split."""
    if spec.stream_k_workers is not None:
        return PARTITION_RULES
    return tuple(r for r in PARTITION_RULES if r not in STREAM_K_ONLY)


def tile_partials(spec: ProblemSpec, tile: tuple[int, int], rule: Optional[str] = None) -> tuple[Partial, ...]:
    """The partials of one tile in k order, by `rule` (default: the problem's declared rule)."""
    kb_n = spec.k_blocks
    if not spec.partitioned:
        return (Partial(0, 0, kb_n),)
    rule = rule or default_rule(spec)
    if spec.stream_k_workers is not None:
        t = tile[0] * spec.tiles_n + tile[1]
        w_n, tiles = spec.stream_k_workers, spec.tiles_m * spec.tiles_n
        if rule == "stream_k_dp_remainder":
            sk_tiles = tiles - max(0, tiles // w_n - 1) * w_n
            if t >= sk_tiles:
                return (Partial(0, 0, kb_n),)
            deal = _Deal(sk_tiles * kb_n, min(w_n, sk_tiles * kb_n), "cutlass_stream_k")
        else:
            deal = _Deal(tiles * kb_n, w_n, rule)
        lo = t * kb_n
        return tuple(Partial(i, s - lo, e - lo) for i, (s, e) in enumerate(deal.pieces(lo, lo + kb_n)))
    deal = _Deal(kb_n, spec.splits, rule)
    return tuple(Partial(i, s, e) for i, (s, e) in enumerate(deal.pieces(0, kb_n)))


def max_partials(spec: ProblemSpec) -> int:
    """The most partials any tile has by the declared rule, without visiting the tiles: split-K
    deals every tile alike (O(splits)); stream-K's pieces of a tile are cut where a worker's share
    begins inside it, so the tile cut most often is found from the W share boundaries (O(W)),
    whatever the tile count."""
    if not spec.partitioned:
        return 1
    kb_n, rule = spec.k_blocks, default_rule(spec)
    if spec.stream_k_workers is None:
        return len(_Deal(kb_n, spec.splits, rule).pieces(0, kb_n))
    w_n, tiles = spec.stream_k_workers, spec.tiles_m * spec.tiles_n
    if rule == "stream_k_dp_remainder":
        sk_tiles = tiles - max(0, tiles // w_n - 1) * w_n  # the rest are whole (one partial)
        d = _Deal(sk_tiles * kb_n, min(w_n, sk_tiles * kb_n), "cutlass_stream_k")
    else:
        d = _Deal(tiles * kb_n, w_n, rule)
    cuts: dict[int, int] = {}
    for b in {d.begin(w) for w in range(1, d.takers)}:
        if 0 < b < d.n and b % kb_n:
            cuts[b // kb_n] = cuts.get(b // kb_n, 0) + 1
    return 1 + max(cuts.values(), default=0)


def partial_of(partials: tuple[Partial, ...], index: Optional[int]) -> Optional[Partial]:
    return next((p for p in partials if p.index == index), None) if index is not None else None


# -- the partition the kernel's taps show --------------------------------------------------------
@dataclass(frozen=True)
class PartitionIssue:
    """A fact of the taps that no valid partition allows: a k-block tapped in two partials (or
    partials out of k order), or a recorded k-block that no partial tapped."""

    kind: str  # "overlap" | "gap"
    tile: tuple[int, int]
    partial: int  # the partial the finding is reported at
    k_block: int
    detail: str

    def describe(self) -> str:
        return f"tile {self.tile}: {self.detail}"


@dataclass(frozen=True)
class AssumedBoundary:
    """Where one partial ends and the next begins, placed by the declared rule because the taps
    leave it open over k-blocks the trace did not record: partial `partial` begins at `k_block`;
    with `end`, partial `partial - 1` is taken to run to the tile's end (k-block `k_block - 1`)."""

    tile: tuple[int, int]
    partial: int
    k_block: int
    after: Optional[int]  # the last tapped k-block before the open range (None: none)
    before: Optional[int]  # the first tapped k-block after it (None: none)
    untraced: tuple[int, ...]  # the k-blocks of the open range the trace did not record
    rule: str
    end: bool = False

    def describe(self) -> str:
        if self.after is None:
            span = f"before k-block {self.before}"
        elif self.before is None:
            span = f"after k-block {self.after}"
        else:
            span = f"between k-blocks {self.after} and {self.before}"
        where = (f"partial {self.partial - 1} runs to the tile's last k-block {self.k_block - 1}" if self.end else
                 f"partial {self.partial} begins at k-block {self.k_block}")
        return (f"tile {self.tile}: the partition boundary {span} is assumed from the declared rule {self.rule} "
                f"({where}): k-block{'s' if len(self.untraced) > 1 else ''} {kb_ranges(self.untraced)} not traced")


def kb_ranges(kbs) -> str:
    """k-blocks as ranges: 2, 5-9, 12."""
    out, run = [], []
    for kb in sorted(kbs):
        if run and kb == run[-1] + 1:
            run.append(kb)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
        run = [kb]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
    return ", ".join(out)


@dataclass(frozen=True)
class TilePartition:
    tile: tuple[int, int]
    partials: tuple[Partial, ...]  # in index order; ranges may overlap only where `issues` says so
    tapped: bool  # read from the tile's mma taps (False: the declared rule, nothing tapped)
    whole: bool = False  # the taps name no partial: the kernel did not split this tile
    issues: tuple[PartitionIssue, ...] = ()
    follows: tuple[str, ...] = ()  # the named rules this tile's partition agrees with
    assumed: tuple[AssumedBoundary, ...] = ()  # boundaries the declared rule placed over untraced k-blocks

    def partial(self, index: Optional[int]) -> Optional[Partial]:
        if index is None:
            return self.partials[0] if self.whole else None
        return partial_of(self.partials, index)

    def assumed_begin(self, index: Optional[int]) -> tuple[AssumedBoundary, ...]:
        """The assumptions where partial `index` begins (where the one before it ends)."""
        return tuple(a for a in self.assumed if index is not None and a.partial == index and not a.end)

    def assumed_end(self, index: Optional[int]) -> tuple[AssumedBoundary, ...]:
        """The assumptions where partial `index` ends."""
        return tuple(a for a in self.assumed if index is not None and a.partial == index + 1)

    def assumed_at(self, kb: int) -> tuple[AssumedBoundary, ...]:
        """The assumptions whose open range holds k-block kb (which partial holds kb is assumed)."""
        return tuple(a for a in self.assumed if (a.after is None or a.after < kb) and
                     (a.before is None or kb < a.before))


def observed_partition(spec: ProblemSpec, tile: tuple[int, int], tapped: Mapping[Optional[int], set],
                       recorded: Callable[[int], bool] = lambda kb: True) -> TilePartition:
    """The partition of one tile read from its mma taps: `tapped` maps each partial index the taps
    name (None: the tile is whole) to the k-blocks tapped in it; `recorded(kb)`: would the trace
    have recorded k-block kb (its k-block selection). The declared rule places a boundary only
    where the taps leave it open, between untapped k-blocks; where that open range holds a
    k-block the trace did not record, the boundary is assumed (TilePartition.assumed)."""
    kb_n = spec.k_blocks
    tile = tuple(tile)
    declared = tile_partials(spec, tile)
    if not tapped:
        return TilePartition(tile, declared, False, follows=(default_rule(spec),) if spec.partitioned else ())
    if None in tapped:  # whole tile (partial -1): one partial over every k-block
        whole = (Partial(0, 0, kb_n),)
        return TilePartition(tile, whole, True, whole=True, issues=_gaps(tile, whole, tapped, recorded),
                             follows=_follows(spec, tile, whole))
    n_obs = max(tapped) + 1
    last = tapped[max(tapped)]
    n = n_obs if max(last) == kb_n - 1 else max(n_obs, len(declared))
    n = min(n, kb_n)
    issues: list[PartitionIssue] = []
    assumed: list[AssumedBoundary] = []
    rule = default_rule(spec)

    def untraced(lo: int, hi: int) -> tuple[int, ...]:  # k-blocks of [lo, hi) the trace did not record
        return tuple(kb for kb in range(lo, hi) if not recorded(kb))
    begins, ends = [0] * n, [kb_n] * n
    prev = 0  # the begin of partial i - 1
    for i in range(1, n):
        before = [kb for j, kbs in tapped.items() if j < i for kb in kbs]
        after = [kb for j, kbs in tapped.items() if j >= i for kb in kbs]
        lo = max(max(before, default=-1) + 1, prev + 1)
        hi = min(min(after, default=kb_n), kb_n - (n - i))
        if lo <= hi:
            want = declared[i].kb_begin if i < len(declared) else hi
            b = min(max(want, lo), hi)
            ends[i - 1] = begins[i] = b
            x, y = max(before, default=None), min(after, default=None)
            lost = untraced(0 if x is None else x + 1, kb_n if y is None else y)
            if lost:  # the taps leave the boundary open over k-blocks that were not traced
                assumed.append(AssumedBoundary(tile, i, b, x, y, lost, rule))
        else:  # tapped k-blocks of partials before i reach past the first of partial i or later
            first = min(after) if after else kb_n - 1
            owner = min((j for j, kbs in tapped.items() if j >= i and first in kbs), default=i)
            twice = [j for j, kbs in tapped.items() if j < i and first in kbs]
            if twice:
                what = f"k-block {first} is tapped in partial {twice[0]} and in partial {owner}"
            elif before:
                what = f"partial {owner} taps k-block {first}, before k-block {max(before)} of an earlier partial"
            else:
                what = (f"partial {owner} taps k-block {first}, which leaves no k-block to the partials before it "
                        f"(partials are numbered 0, 1, ... in k order within the tile)")
            issues.append(PartitionIssue("overlap", tile, owner, first,
                                         f"{what}: the partials overlap (a k-block summed twice)"))
            ends[i - 1], begins[i] = (max(before) + 1 if before else begins[i - 1] + 1), first
        prev = begins[i]
    parts = tuple(Partial(i, begins[i], max(ends[i], begins[i] + 1)) for i in range(n))
    top = max(kb for kbs in tapped.values() for kb in kbs)
    lost = untraced(top + 1, kb_n)
    if n == n_obs and lost:  # no partial tapped the tile's last k-blocks: that none follows is assumed
        assumed.append(AssumedBoundary(tile, n, kb_n, top, None, lost, rule, end=True))
    issues += _gaps(tile, parts, tapped, recorded)
    return TilePartition(tile, parts, True, issues=tuple(issues), follows=() if issues else _follows(spec, tile, parts),
                         assumed=tuple(assumed))


def _gaps(tile, parts, tapped, recorded) -> list[PartitionIssue]:
    """Recorded k-blocks no partial tapped, outside every partial's own tapped span (inside a span
    an untapped k-block is judged by the span's accumulator)."""
    spans = [(min(kbs), max(kbs)) for kbs in tapped.values() if kbs]
    seen = {kb for kbs in tapped.values() for kb in kbs}
    out = []
    kb_n = max(p.kb_end for p in parts)
    for kb in range(kb_n):
        if kb in seen or not recorded(kb) or any(a < kb < b for a, b in spans):
            continue
        p = next((q for q in parts if q.holds(kb)), parts[-1])
        out.append(PartitionIssue("gap", tile, p.index, kb, f"k-block {kb} is tapped in no partial: no partial "
                                                           f"accumulated it (a gap in the partition)"))
    return out


def _follows(spec: ProblemSpec, tile, parts: tuple[Partial, ...]) -> tuple[str, ...]:
    if not spec.partitioned:
        return ()
    return tuple(r for r in rules_for(spec) if tile_partials(spec, tile, r) == parts)


def describe_partitions(spec: ProblemSpec, partitions: Mapping) -> Optional[str]:
    """One line on the partition the taps show against the declared rule (None: nothing tapped,
    or a problem that is not split)."""
    tapped = [p for p in partitions.values() if p.tapped and not p.issues]
    if not spec.partitioned or not tapped:
        return None
    rule = default_rule(spec)
    common = set(rules_for(spec))
    for p in tapped:
        common &= set(p.follows)
    n = len(tapped)
    where = f"read from the mma taps of {n} tile{'s' if n > 1 else ''}"
    n_assumed = sum(len(p.assumed) for p in tapped)
    if n_assumed:
        where += (f"; {n_assumed} boundar{'y' if n_assumed == 1 else 'ies'} over untraced k-blocks placed by the "
                  f"declared rule, not observed")
    if rule in common:
        return f"partition: the taps follow the declared rule {rule} ({where})"
    named = [r for r in rules_for(spec) if r in common]
    said = "follow no named rule (judged as tapped)" if not named else f"follow {named[0]}" if len(named) == 1 else \
        f"follow {' or '.join(named)} (alike on these tiles)"
    return f"partition: the taps {said}, not the declared {rule}; each tile judged by its tapped partials ({where})"


def group_offsets(spec: ProblemSpec) -> Optional[tuple[int, ...]]:
    """Row offsets of the groups, with the total at the end (G + 1 entries); None: not grouped."""
    sizes = spec.group_sizes
    if sizes is None:
        return None
    out, acc = [0], 0
    for m in sizes:
        acc += m
        out.append(acc)
    return tuple(out)
