"""How much one run says of a ratio of two percentiles over the same replies.

A first token's p99 over a few hundred replies is the largest two or three of them: one prompt arriving
behind others decides it, and the same code read 1.30x and 1.05x server-only's in two runs of the emulated
7B (docs/results.md, "how much one run says of a p99"). Resampling the replies of one run, each drawn with
both modes' times (a reply is one prompt in both), gives the range the ratio moves over from the replies
alone. It does not see what moves between runs (which guesses a pass holds), so it is a floor on the
uncertainty, not its whole: two runs' intervals overlapped where their ratios differed.
"""

from __future__ import annotations

import numpy as np

DRAWS = 2000  # resamples: the interval's ends move by about a hundredth between seeds at this many
LEVEL = 0.9  # the share of the resampled ratios the interval holds


def _nearest_rank(values: np.ndarray, p: float) -> np.ndarray:
    """The p-th percentile of each row by the nearest rank (benchmarks/service_level.py `percentile`)."""
    ordered = np.sort(values, axis=-1)
    index = min(ordered.shape[-1] - 1, int(round(p / 100 * (ordered.shape[-1] - 1))))
    return ordered[..., index]


def percentile_ratio_interval(a: list[float], b: list[float], p: float = 99, level: float = LEVEL,
                              draws: int = DRAWS, seed: int = 0) -> tuple[float, float] | None:
    """(low, high): the central `level` of the ratio pctl(a) / pctl(b) over `draws` resamples of the pairs
    (a[i], b[i]), with replacement; None for no pairs or a zero percentile in b."""
    if len(a) != len(b):
        raise ValueError(f"the two lists must pair the same replies: {len(a)} against {len(b)}")
    if not a:
        return None
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(first), size=(draws, len(first)))
    below = _nearest_rank(second[picks], p)
    if np.any(below <= 0):
        return None
    ratios = _nearest_rank(first[picks], p) / below
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)
