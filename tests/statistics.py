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
