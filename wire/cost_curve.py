"""A device's cost curve c(n) as both ends read it: seconds for a forward pass of n tokens.

The service measures the curve (remote_verify/pass_costs.py) and sends a few points of it
in its Welcome (`PassCost`); both ends evaluate it between and beyond those points the same
way, here.
"""

from __future__ import annotations

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


def curve_seconds(curve: Sequence[PassCost], tokens: int) -> float | None:
    """c(tokens) from a Welcome's curve (the client's view of the same function)."""
    return interpolate(sorted((point.tokens, point.ms / 1000) for point in curve), tokens)
