"""The sampling definition both ends share: ties at the top-k and top-p cuts keep the lowest ids."""

from __future__ import annotations

import numpy as np
import pytest

from wire.protocol import SamplingParams
from benchmarks.sampling_cost import sorted_warp
from wire.sampling import warp


@pytest.mark.parametrize("top_k, kept", [(3, [4, 5, 6]), (6, [0, 1, 4, 5, 6, 7]), (1, [4])])
def test_top_k_ties_keep_the_lowest_token_ids(top_k, kept):
    """logits [0,0,0,0,1,1,1,1]: top_k 3 keeps ids 4, 5, 6; the cut through the zeros keeps 0 and 1."""
    probs = warp(np.array([0, 0, 0, 0, 1, 1, 1, 1], dtype=np.float32), SamplingParams(temperature=1.0, top_k=top_k))
    assert np.flatnonzero(probs).tolist() == kept


def test_top_k_ties_do_not_depend_on_the_vocabulary_around_them():
    """The same tie rule at a Qwen-sized vocabulary, with ties scattered across it."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=151_936).astype(np.float32)
    logits[[7, 90_000, 151_000, 42]] = 10.0  # four tied leaders, for a top_k of 3
    probs = warp(logits, SamplingParams(temperature=0.7, top_k=3))
    assert np.flatnonzero(probs).tolist() == [7, 42, 90_000]


def test_top_p_ties_at_the_cut_keep_the_lowest_token_ids():
    """Four equal tokens (about 0.25 each) and top_p 0.4: the two with the lowest ids are kept."""
    probs = warp(np.array([0, 5, 5, -9, 5, 5], dtype=np.float64), SamplingParams(temperature=1.0, top_p=0.4))
    assert np.flatnonzero(probs).tolist() == [1, 2]


def test_a_drawn_index_is_the_one_numpys_choice_draws_for_the_same_generator():
    """draw_index replaces Generator.choice(n, p=...) in the hot path: a seed must keep deciding the
    same token, for supports with zeros, ties, one token and a whole vocabulary."""
    from wire.sampling import draw_index

    shapes = [(1, 0.0), (3, 0.3), (8, 0.5), (512, 0.3), (151_936, 0.9)]
    for size, zeros in shapes:
        for seed in range(300 if size < 1000 else 20):
            weights = np.random.default_rng(seed).random(size) ** 4
            weights[np.random.default_rng(seed + 1).random(size) < zeros] = 0.0
            weights[seed % size] += 1e-3  # never all zero
            expected = np.random.default_rng(seed + 7).choice(size, p=weights / weights.sum())
            assert draw_index(np.random.default_rng(seed + 7), weights) == expected, (size, seed)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.5])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (0, 0.9), (0, 0.5), (0, 0.999), (40, 1.0), (40, 0.8), (1, 1.0)])
def test_warp_keeps_the_definition_without_sorting_the_vocabulary(temperature, top_k, top_p):
    """At a Qwen-sized vocabulary, logits smooth, peaked, flat, in ties (rounded to a few values) and
    masked (a grammar's -inf): the same kept set as the whole sort's, the same probabilities."""
    rng = np.random.default_rng(int(temperature * 10) + top_k)
    vocab = 151_936
    peaked = rng.normal(size=vocab) * 2.0
    peaked[rng.integers(vocab, size=5)] += 12.0
    masked = rng.normal(size=vocab) * 3.0
    masked[rng.random(vocab) < 0.97] = -np.inf
    shapes = [rng.normal(size=vocab) * 3.0, peaked, rng.normal(size=vocab) * 0.01,
              np.round(rng.normal(size=vocab)), masked]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for logits in shapes:
        logits = logits.astype(np.float32)
        fast, reference = warp(logits, params), sorted_warp(logits, params)
        assert np.flatnonzero(fast).tolist() == np.flatnonzero(reference).tolist()
        np.testing.assert_allclose(fast, reference, rtol=1e-9, atol=1e-300)
