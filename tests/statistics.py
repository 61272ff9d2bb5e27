"""The goodness-of-fit test every exactness test uses, so its power is measured once."""

from __future__ import annotations

import numpy as np
from scipy import stats


SAMPLES = 30_000  # draws per exactness test
ALPHA = 0.01  # with SAMPLES, a 1-point shift of mass between two likely outcomes is caught ~95% of the time


def chi_square_pvalue(counts: np.ndarray, exact: np.ndarray) -> float:
    """p-value of observed `counts` under the exact distribution `exact` (same shape)."""
    if counts[exact == 0].any():  # an outcome the target can never produce
        return 0.0
    keep = exact * counts.sum() >= 5  # lump rare cells so the chi-square approximation holds
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(exact[keep], exact[~keep].sum()) * counts.sum()
    return float(stats.chisquare(observed[expected > 0], expected[expected > 0]).pvalue)


def detectable_shift(exact: np.ndarray, samples: int, trials: int = 200, seed: int = 0) -> float:
    """The power of `chi_square_pvalue` at `samples` draws from `exact`: the smallest shift of
    probability mass between its two likeliest outcomes that the test catches (p < ALPHA) in at
    least 90% of `trials` simulated runs, to 0.001."""
    rng = np.random.default_rng(seed)
    top = np.argsort(-exact)[:2]

    def caught(shift: float) -> float:
        shifted = exact.copy()
        shifted[top[0]] -= shift
        shifted[top[1]] += shift
        return np.mean([chi_square_pvalue(rng.multinomial(samples, shifted), exact) < ALPHA for _ in range(trials)])

    low, high = 0.0, float(exact[top[0]])  # caught(low) < 0.9 <= caught(high), found by halving
    while high - low > 0.001:
        middle = (low + high) / 2
        low, high = (low, middle) if caught(middle) >= 0.9 else (middle, high)
    return round(high, 3)
