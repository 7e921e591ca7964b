"""A job's curves: the training loss per chunk and the eval metric per checkpoint, kept in its
status (so across continue-as-new too), bounded in size."""

from __future__ import annotations

import math
from typing import Final

from pydantic import BaseModel, ConfigDict

#: Points a curve keeps. The status travels in every status query and in each
#: continue-as-new input, so it must stay small (~40 bytes a point as JSON); 500 points
#: are more than a terminal plot or a PNG can show apart.
MAX_CURVE_POINTS: Final = 500
#: Points of each curve of a program's own metrics (up to eight of them travel together).
MAX_METRIC_POINTS: Final = 250


class CurvePoint(BaseModel):
    model_config = ConfigDict(extra="ignore")

    step: int
    value: float


def add_point(
    curve: list[CurvePoint], step: int, value: float, limit: int = MAX_CURVE_POINTS
) -> None:
    """Append ``(step, value)`` to ``curve`` in place.

    A point replaces every point at its step or later: those were measured on weights a
    recovery (or a resume from an earlier checkpoint) went back from, and the curve shows
    the run that leads to the weights the job has.

    Over the bound, the point whose removal leaves the smallest gap in steps goes, the
    oldest of equals: a full curve loses every other point from its start on, then again,
    so it stays evenly spread over the whole run, first and last points kept. (Halving the
    older half at each overflow would thin the oldest points again and again, until the
    start of the run was a lone point.)
    """
    if not math.isfinite(value):
        return  # a diverged loss: JSON has no NaN (it would travel as null), nor a plot
    while curve and curve[-1].step >= step:
        curve.pop()
    curve.append(CurvePoint(step=step, value=value))
    if len(curve) > limit:
        drop = min(range(1, len(curve) - 1), key=lambda i: curve[i + 1].step - curve[i - 1].step)
        del curve[drop]
