"""Acceptance math on hand-built distributions: greedy matching and exact rejection sampling."""

from __future__ import annotations

import numpy as np
import pytest

from remote_verify.acceptance import accept_greedy, accept_sampled
from wire.protocol import SamplingParams, SparseDist
from wire.sampling import truncate, warp
from tests.statistics import ALPHA, SAMPLES, chi_square_pvalue


def test_greedy_accepts_the_matching_prefix_then_corrects():
    """Greedy acceptance keeps the longest prefix equal to the target's argmax."""
    assert accept_greedy([5, 6, 7, 8], [5, 6, 9]) == (2, 7)
    assert accept_greedy([5, 6, 7, 8], [1, 6, 7]) == (0, 5)
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == (3, 8)  # bonus token
    assert accept_greedy([4], []) == (0, 4)  # k = 0: the target's own token


def test_warp_applies_top_k_then_top_p():
    """Temperature, top-k and top-p keep exactly the expected tokens."""
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    full = warp(logits, SamplingParams(temperature=1.0))
    np.testing.assert_allclose(full, [0.5, 0.2, 0.15, 0.1, 0.05])
    top2 = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(top2, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    nucleus = warp(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5+0.2 < 0.8 <= 0.85
    np.testing.assert_allclose(nucleus, np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    hot = warp(logits, SamplingParams(temperature=2.0))
    expected = np.sqrt([0.5, 0.2, 0.15, 0.1, 0.05])
    np.testing.assert_allclose(hot, expected / expected.sum())


def test_truncate_keeps_the_most_likely_tokens():
    """A sparse draft distribution keeps the cap most likely tokens, renormalised."""
    dist = truncate(np.array([0.1, 0.4, 0.0, 0.3, 0.2]), cap=2)
    assert sorted(zip(dist.ids, np.round(dist.probs, 6))) == [(1, round(4 / 7, 6)), (3, round(3 / 7, 6))]


def _first_two(p: np.ndarray, q: np.ndarray, n: int, seed: int, bias: float = 0.0) -> np.ndarray:
    """Draft 2 tokens from q, accept against p; count the first two committed tokens (V*V,)."""
    rng = np.random.default_rng(seed)
    vocab = p.shape[1]
    counts = np.zeros(vocab * vocab, dtype=np.int64)
    dist0 = SparseDist(ids=list(range(vocab)), probs=q[0].tolist())
    for _ in range(n):
        x0 = int(rng.choice(vocab, p=q[0]))
        x1 = int(rng.choice(vocab, p=q[1]))
        dist1 = SparseDist(ids=list(range(vocab)), probs=q[1].tolist())
        # The target's distribution at position 1 depends on the first token: p[1 + x0 % 2].
        target = np.stack([p[0], p[1 + x0 % 2], p[1 + x1 % 2]])
        if bias:  # a deliberately wrong acceptance rule, to show the test can fail
            target = target.copy()
            target[0] = target[0] + bias * ((np.arange(vocab) == x0) & (p[0] > 0))
        accepted, token = accept_sampled(target, [x0, x1], [dist0, dist1], lambda i, what: rng)
        first = [x0, x1][:accepted] + [token]
        if len(first) < 2:  # rejected at position 0: the next token comes from p(. | first)
            first.append(int(rng.choice(vocab, p=p[1 + first[0] % 2])))
        counts[first[0] * vocab + first[1]] += 1
    return counts


def _exact_first_two(p: np.ndarray) -> np.ndarray:
    vocab = p.shape[1]
    return np.concatenate([p[0][a] * p[1 + a % 2] for a in range(vocab)])


HAND_P = np.array([[0.45, 0.25, 0.2, 0.1, 0.0], [0.1, 0.6, 0.1, 0.1, 0.1], [0.3, 0.05, 0.05, 0.3, 0.3]])
HAND_Q = np.array([[0.1, 0.1, 0.3, 0.3, 0.2], [0.5, 0.1, 0.1, 0.2, 0.1]])


def test_rejection_sampling_distance_to_target_shrinks_with_samples():
    """The total variation to the exact target distribution falls as samples grow."""
    exact = _exact_first_two(HAND_P)
    distances = []
    for n in (500, 5000, 50000):
        counts = _first_two(HAND_P, HAND_Q, n, seed=n)
        distances.append(0.5 * np.abs(counts / n - exact).sum())
    assert distances[0] > distances[1] > distances[2]
    assert distances[2] < 0.015


def test_rejection_sampling_matches_the_target_by_chi_square():
    """SAMPLES draws of the first two tokens fit the target's exact joint distribution."""
    counts = _first_two(HAND_P, HAND_Q, SAMPLES, seed=1)
    assert chi_square_pvalue(counts, _exact_first_two(HAND_P)) > ALPHA


@pytest.mark.parametrize("bias", [0.02])
def test_chi_square_catches_a_biased_acceptance_rule(bias):
    """The same test, same sample size, rejects an acceptance rule that is off by a little."""
    counts = _first_two(HAND_P, HAND_Q, SAMPLES, seed=2, bias=bias)
    assert chi_square_pvalue(counts, _exact_first_two(HAND_P)) < ALPHA


def test_chi_square_power_against_a_one_percent_shift():
    """At the exactness tests' sample size and threshold, moving 1% of the mass is caught >= 90% of the time."""
    rng = np.random.default_rng(0)
    exact = _exact_first_two(HAND_P)
    shifted = exact.copy()
    top = np.argsort(-exact)[:2]
    shifted[top[0]] -= 0.01
    shifted[top[1]] += 0.01
    caught = sum(chi_square_pvalue(rng.multinomial(SAMPLES, shifted), exact) < ALPHA for _ in range(100))
    assert caught >= 90
