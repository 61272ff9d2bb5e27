"""A device's cost curve c(n) as both ends read it: seconds for a forward pass of n tokens.

The service measures the curve (remote_verify/pass_costs.py) and sends a few points of it
in its Welcome (`PassCost`); both ends evaluate it between and beyond those points the same
way, here.
"""

from __future__ import annotations

import math
from typing import Sequence

from wire.protocol import PassCost


def interpolate(points: list[tuple[int, float]], tokens: int) -> float | None:
    """A piecewise-linear curve through (tokens, seconds) points sorted by tokens, evaluated at
    `tokens`: flat below the first point, along the last slope (never falling) past the last."""
    if not points:
        return None
    if tokens <= points[0][0]:
        return points[0][1]
    for (n0, s0), (n1, s1) in zip(points, points[1:]):
        if tokens <= n1:
            return s0 + (s1 - s0) * (tokens - n0) / (n1 - n0)
    if len(points) == 1:
        n, s = points[0]
        return s * tokens / n  # one size seen: assume the cost grows with the tokens
    (n0, s0), (n1, s1) = points[-2], points[-1]
    return s1 + max(0.0, (s1 - s0) / (n1 - n0)) * (tokens - n1)


MAX_POINTS = 64  # a measured curve has a dozen sizes; the rest of a longer one is not read
MAX_PASS_MS = 3_600_000.0  # a pass that takes an hour is already nonsense


def curve_points(curve: Sequence[PassCost]) -> list[tuple[int, float]]:
    """A Welcome's curve as (tokens, seconds) points to interpolate: sorted, one per size, and
    only points that can be a pass (a size of 1 or more; a finite time, 0 to an hour). A
    service states it; a broken or hostile one must not make the client divide by zero."""
    points: dict[int, float] = {}
    for point in curve[:MAX_POINTS]:
        if point.tokens >= 1 and math.isfinite(point.ms) and 0.0 <= point.ms <= MAX_PASS_MS:
            points.setdefault(point.tokens, point.ms / 1000)
    return sorted(points.items())


def curve_seconds(curve: Sequence[PassCost], tokens: int) -> float | None:
    """c(tokens) from a Welcome's curve (the client's view of the same function); None when it
    states no usable point."""
    return interpolate(curve_points(curve), tokens)
