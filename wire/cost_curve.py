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


EXACT_SIZES = 16  # sizes up to this are points of their own (a stream's blocks; the calibration's)
BINS_PER_OCTAVE = 8  # past them, sizes within about 9% of each other are pooled


def pooled_curve(measured: Sequence[tuple[int, float, float]]) -> tuple[list[tuple[float, float]], float, float]:
    """A smooth curve from measured (tokens, seconds, weight) sizes, sorted by tokens: the points
    (sizes past EXACT_SIZES pooled by BINS_PER_OCTAVE into their weighted means, then pooled with
    their neighbours wherever a larger size measured cheaper, so that the curve never falls), the
    slope before the first point (a weighted least-squares line through the points of at most twice
    its size) and the slope past the last (one through those of at least half its size); never
    falling; with a single point, cost in proportion to tokens."""
    bins: dict[int, list[float]] = {}
    for tokens, seconds, weight in measured:
        key = tokens if tokens <= EXACT_SIZES else \
            EXACT_SIZES + 1 + round(BINS_PER_OCTAVE * math.log2(tokens / EXACT_SIZES))
        pooled = bins.setdefault(key, [0.0, 0.0, 0.0])
        pooled[0] += tokens * weight
        pooled[1] += seconds * weight
        pooled[2] += weight
    blocks: list[list[float]] = []  # [tokens x weight, seconds x weight, weight], cost never falling
    for key in sorted(bins):
        blocks.append(list(bins[key]))
        while len(blocks) > 1 and blocks[-1][1] / blocks[-1][2] < blocks[-2][1] / blocks[-2][2]:
            last = blocks.pop()
            blocks[-1] = [a + b for a, b in zip(blocks[-1], last)]
    points = [(t / w, s / w) for t, s, w in blocks]
    weighted = list(zip(points, [w for _, _, w in blocks]))
    if len(points) < 2:
        slope = points[0][1] / points[0][0] if points else 0.0
        return points, slope, slope
    lower = [(p, w) for p, w in weighted if p[0] <= 2 * points[0][0]]
    upper = [(p, w) for p, w in weighted if p[0] >= points[-1][0] / 2]
    return points, _fitted_slope(lower if len(lower) > 1 else weighted[:2]), \
        _fitted_slope(upper if len(upper) > 1 else weighted[-2:])


def _fitted_slope(weighted: list[tuple[tuple[float, float], float]]) -> float:
    """The slope of the weighted least-squares line through ((tokens, seconds), weight) points, never below 0."""
    total = sum(w for _, w in weighted)
    mean_n = sum(p[0] * w for p, w in weighted) / total
    mean_s = sum(p[1] * w for p, w in weighted) / total
    spread = sum(w * (p[0] - mean_n) ** 2 for p, w in weighted)
    slope = sum(w * (p[0] - mean_n) * (p[1] - mean_s) for p, w in weighted) / spread if spread > 0 else 0.0
    return max(0.0, slope)


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
