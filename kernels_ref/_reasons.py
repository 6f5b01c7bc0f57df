"""A stage's `check_supported` returns the reasons its input cannot be modelled, not a bool; the
stage's frozen params and launchers refuse such an input here, with one ValueError naming them all."""

from __future__ import annotations

from typing import Sequence


def refuse(reasons: Sequence[str]) -> None:
    """Raise a ValueError naming every reason ("; " between them), unless there are none."""
    if reasons:
        raise ValueError("; ".join(reasons))
