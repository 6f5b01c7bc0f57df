"""What the kernel recorded, indexed: its taps by site and by stage, where each tap's elements were
recorded, the tensor-map field records, and what the records themselves break (a site tapped twice
with different values, operand taps the partition has no place for). Built once from the
recording; nothing in it changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

import torch

from harness.taps import Tap
from kernels_ref._common import device_tensor
from kernels_ref import load as ref_load
from oracle.judging.comparison import bit_patterns
from oracle.judging.differential.geometry import Geometry
from oracle.run.recording import Recording
from oracle.run.confounds import Confound, ConfoundKind


@dataclass(frozen=True, eq=False)
class TapIndex:
    geo: Geometry
    records: tuple[Tap, ...]  # every tap, as recorded
    descriptors: tuple  # the tensor-map field records (harness.tensormap.DescriptorRecord)
    sites: Mapping[tuple, Tap]  # by (stage, tile, k-block, partial): the later of two taps of one site
    traced_tiles: frozenset
    confounds: tuple[Confound, ...]  # what the records break, in the order found (open confounds of the run)

    @classmethod
    def of(cls, rec: Recording, geo: Geometry) -> "TapIndex":
        sites, confounds = {}, []
        for t in rec.taps:
            seen = sites.get(t.site)
            if seen is not None and not _same_tap(seen, t):
                confounds.append(Confound.of(ConfoundKind.DISAGREEING_TAPS, t.stage, site=t.describe()))
            sites[t.site] = t
        odd = _unexpected_records(rec.taps, geo)
        if odd is not None:
            confounds.append(odd)
        return cls(geo, tuple(rec.taps), tuple(rec.descriptors), MappingProxyType(sites),
                   frozenset(t.tile for t in rec.taps), tuple(dict.fromkeys(confounds)))

    def taps_of(self, stage: str) -> list[Tap]:
        return sorted((t for t in self.records if t.stage == stage),
                      key=lambda t: (t.tile, -1 if t.partial is None else t.partial,
                                     -1 if t.k_block is None else t.k_block))

    def tap(self, stage: str, tile, k_block=None, partial=None) -> Optional[Tap]:
        return self.sites.get((stage, tuple(tile), k_block, partial))

    def recorded(self, tap: Tap) -> torch.Tensor:
        """True where the kernel recorded the element (for an image tap: per byte)."""
        dev = self.geo.dev
        if tap.mask is None:
            return torch.ones(tuple(tap.values.shape), dtype=torch.bool, device=dev)
        return tap.mask.to(dev)

    def stack_taps(self, taps) -> tuple[torch.Tensor, torch.Tensor]:
        """Many taps of one shape as one stack on the reference device: their values (in their
        dtype; mixed dtypes as float32) and where the kernel recorded them (recorded())."""
        dev = self.geo.dev
        vals = [t.values for t in taps]
        if len({v.dtype for v in vals}) > 1:
            vals = [v.float() for v in vals]
        values = torch.stack(vals).to(dev)
        if all(t.mask is None for t in taps):
            recorded = torch.ones(tuple(values.shape), dtype=torch.bool, device=dev)
        else:
            ones = torch.ones(tuple(vals[0].shape), dtype=torch.bool)
            recorded = torch.stack([ones if t.mask is None else t.mask for t in taps]).to(dev)
        return values, recorded

    def image_elements_units(self, taps, op: str) -> torch.Tensor:
        """Image taps' recorded bytes as logical-tile masks, [len(taps), *tile shape]: an element is
        recorded when every one of its bytes is."""
        geo = self.geo
        spec, dev = geo.spec, geo.dev
        shape = (len(taps),) + ((geo.bm, geo.bk) if op == "a" else (geo.bk, geo.bn))
        out = torch.ones(shape, dtype=torch.bool, device=dev)
        masked = [i for i, t in enumerate(taps) if t.mask is not None]
        if masked:
            marks = torch.where(torch.stack([taps[i].mask for i in masked]).to(dev), 0xFF, 0).to(torch.uint8)
            tile = ref_load.tile_from_image(marks, op, getattr(spec, f"{op}_major"),
                                            geo.bm if op == "a" else geo.bn, geo.bk, getattr(spec, f"{op}_dtype"),
                                            getattr(spec, f"swizzle_{op}"))
            out[device_tensor(masked, dev)] = bit_patterns(tile) == (0xFF if tile.element_size() == 1 else -1)
        return out


def _same_tap(a: Tap, b: Tap) -> bool:
    if a.values.shape != b.values.shape or a.values.dtype != b.values.dtype:
        return False
    if (a.mask is None) != (b.mask is None) or (a.mask is not None and not torch.equal(a.mask, b.mask)):
        return False
    return bool((bit_patterns(a.values) == bit_patterns(b.values)).all())


def _unexpected_records(taps, geo: Geometry) -> Optional[Confound]:
    """Operand taps of a split tile that belong to no partial its mma taps show (a partial the mma
    stage never tapped, or a k-block outside the partial): the judgement has no place for them, so
    they are an open confound, named."""
    odd = []
    for t in taps:
        part = geo.partitions.get(t.tile)
        if part is None or t.k_block is None or not (t.stage.startswith("load_") or t.stage.startswith("descriptor_")):
            continue
        p = part.partial(t.partial)
        if p is None or not p.holds(t.k_block) or (t.partial is None) != part.whole:
            odd.append(t.describe())
    if not odd:
        return None
    shown = "; ".join(odd[:4]) + (f" and {len(odd) - 4} more" if len(odd) > 4 else "")
    return Confound.of(ConfoundKind.UNPLACED_OPERAND_TAPS, records=shown)
