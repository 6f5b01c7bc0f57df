"""What the stages of one analysis read, bundled: the recording, its geometry (geometry.Geometry),
its taps indexed (tap_index.TapIndex) and its tensors on the reference device
(device_operands.DeviceOperands), each built once and read-only; and the values a stage hands on
(StageResult, Source). A stage writes nothing here: it returns its result and its notes
(judge.StageNotes). One group of a grouped or batched problem carries the other groups' block
scales beside it (`peers`), for naming a scale of another group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from oracle.judging.compare import Comparison, Status
from oracle.judging.diagnose import StageOutcome
from oracle.judging.differential.device_operands import DeviceOperands
from oracle.judging.differential.geometry import Geometry
from oracle.judging.differential.tap_index import TapIndex
from oracle.run.recording import Recording


@dataclass(frozen=True)
class StageResult:
    name: str
    teacher_forced: Comparison
    chained: Comparison

    @classmethod
    def not_run(cls, name: str) -> "StageResult":
        """A stage with nothing to compare (no taps): not run either way."""
        return cls(name, NOT_RUN_STAGE, NOT_RUN_STAGE)

    @property
    def outcome(self) -> StageOutcome:
        return StageOutcome(self.name, self.teacher_forced.status, self.chained.status,
                            forced_bad_tiles=self.teacher_forced.bad_tiles, chained_bad_tiles=self.chained.bad_tiles)


NOT_RUN_STAGE = Comparison(Status.NOT_RUN)


@dataclass(frozen=True)
class Source:
    """The accumulator a tile's epilogue is fed with, as the kernel had it: its final mma tap, its
    reduce tap, or its partials summed by the reference (a stand-in for an untapped reduction)."""

    values: torch.Tensor
    recorded: torch.Tensor
    name: str
    stand_ins: tuple = ()
    assumed: tuple[str, ...] = ()  # partition assumptions the values rest on (Geometry.assumed)


@dataclass(frozen=True, eq=False)
class Context:
    rec: Recording
    geo: Geometry
    taps: TapIndex
    ops: DeviceOperands
    peers: Optional[Any] = None  # one group of a grouped problem: the other groups' scales (groups.ScalePeers)

    @classmethod
    def of(cls, rec: Recording, device: torch.device, peers=None) -> "Context":
        geo = Geometry.of(rec, device)
        return cls(rec, geo, TapIndex.of(rec, geo), DeviceOperands.of(rec, geo), peers)
