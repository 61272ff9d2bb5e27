"""The range a p99 ratio moves over by resampling one run's replies (benchmarks/paired_resampling.py)."""

import numpy as np
import pytest

from benchmarks.paired_resampling import percentile_ratio_interval


def test_each_reply_is_drawn_with_both_modes_times():
    """Every reply 1.5x as slow in one mode as in the other, the replies themselves from 20 ms to 2 s: every
    resample's ratio is 1.5. Drawn apart (a mode's times resampled without the other's), the ratio of two
    p99s of such spread replies moves from well below 1 to well above."""
    rng = np.random.default_rng(3)
    server = list(rng.uniform(0.02, 2.0, size=150))
    default = [1.5 * s for s in server]
    low, high = percentile_ratio_interval(default, server)
    assert low == pytest.approx(1.5) and high == pytest.approx(1.5)


def test_the_interval_holds_the_truth_and_narrows_with_more_replies():
    """Both modes' first tokens drawn alike (a ratio of 1 in truth): the interval over 100 replies holds 1
    and is wide; over 3,000 it is several times narrower, within 10% of 1. One mode 1.6x slower at every
    reply, within noise: 1 is outside."""
    rng = np.random.default_rng(7)

    def replies(n, scale):
        base = rng.lognormal(-3.0, 0.4, size=n)  # a prompt's own cost, the same in both modes
        return list(scale * base * rng.lognormal(0, 0.2, size=n)), list(base * rng.lognormal(0, 0.2, size=n))

    few_low, few_high = percentile_ratio_interval(*replies(100, 1.0))
    many_low, many_high = percentile_ratio_interval(*replies(3000, 1.0))
    assert few_low < 1.0 < few_high and few_high - few_low > 0.15
    assert 0.9 < many_low < many_high < 1.1 and (many_high - many_low) * 2.5 < few_high - few_low
    slow_low, _ = percentile_ratio_interval(*replies(300, 1.6))
    assert slow_low > 1.0


def test_unpaired_or_empty_lists_are_refused_or_none():
    with pytest.raises(ValueError, match="pair the same replies"):
        percentile_ratio_interval([0.1, 0.2], [0.1])
    assert percentile_ratio_interval([], []) is None
