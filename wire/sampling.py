"""The one definition of a sampling distribution: temperature, then top-k, then top-p.

Both ends use it: the service to turn target logits into p, the drafter to turn draft
logits into q. Exactness does not depend on the drafter agreeing (acceptance corrects any
q), but acceptance is highest when it does. NumPy only, so the client stays light.
"""

from __future__ import annotations

import numpy as np

from wire.protocol import SamplingParams, SparseDist


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Logits (V,) -> probabilities (V,) in float64, zero outside the kept set.

    Not for greedy decoding: temperature must be positive.

    The kept set is the likeliest tokens in descending order (equal logits in ascending id), cut
    at top-k, then at the shortest prefix whose mass reaches top-p. It never sorts the whole
    vocabulary: a sort of 151,936 logits costs about 20 ms, more than a large target's step on a
    GPU, and both ends warp at every sampled token (the service for each pick, the drafter for
    each guess). With no cut it is the softmax; top-k sorts only its k; top-p alone sorts the
    likeliest few, more only as long as they hold less than top-p of the mass.
    """
    assert params.temperature > 0.0, "warp() is for sampling; greedy uses argmax"
    scaled = logits.astype(np.float64) / params.temperature
    vocab = scaled.shape[-1]
    if not 0 < params.top_k < vocab and params.top_p >= 1.0:
        probs = np.exp(scaled - scaled.max())
        return probs / probs.sum()
    # Ties are broken by token id, lowest first, at every cut (top-k and top-p), so that the
    # kept set is a function of the logits alone and both ends keep the same one. (argpartition
    # alone would pick among tied logits in whatever order its selection left them.)
    if 0 < params.top_k < vocab:
        kept = _likeliest(scaled, params.top_k)[:params.top_k]
        kept_probs = np.exp(scaled[kept] - scaled[kept[0]])
        kept_probs /= kept_probs.sum()
        cumulative = np.cumsum(kept_probs)
    else:  # top-p alone: the likeliest few, in order, until they hold top_p of the whole mass
        top = scaled.max()
        whole = np.exp(scaled - top).sum()
        n = min(64, vocab)
        while True:
            kept = _likeliest(scaled, n)
            kept_probs = np.exp(scaled[kept] - top) / whole
            cumulative = np.cumsum(kept_probs)
            if len(kept) >= vocab or cumulative[-1] >= params.top_p:
                break
            n = min(n * 8, vocab)
    if params.top_p < 1.0:
        # Smallest prefix whose mass reaches top_p (the token that crosses it is kept).
        n_keep = min(int(np.searchsorted(cumulative, params.top_p, side="left")) + 1, len(kept))
        kept, kept_probs = kept[:n_keep], kept_probs[:n_keep]
    probs = np.zeros(vocab, dtype=np.float64)
    probs[kept] = kept_probs / kept_probs.sum()
    return probs


def _likeliest(scaled: np.ndarray, n: int) -> np.ndarray:
    """The ids of the n likeliest tokens and of every token tied with the n-th, in descending order
    of `scaled` and ascending id among equals: the first len(result) places of the whole order."""
    vocab = scaled.shape[-1]
    if n >= vocab:
        ids = np.arange(vocab)
    else:
        cut = np.partition(scaled, vocab - n)[vocab - n]  # the n-th largest
        ids = np.flatnonzero(scaled >= cut)  # ascending ids
    return ids[np.argsort(-scaled[ids], kind="stable")]


def truncate(probs: np.ndarray, cap: int) -> SparseDist:
    """Keep the `cap` most likely tokens of `probs` (V,), renormalised, as a SparseDist."""
    support = np.flatnonzero(probs)
    if support.size > cap:
        support = support[np.argpartition(-probs[support], cap - 1)[:cap]]
    kept = probs[support]
    kept = kept / kept.sum()
    return SparseDist(ids=support.tolist(), probs=kept.tolist())


def sample(dist: SparseDist, rng: np.random.Generator) -> int:
    """Draw one token id from a sparse distribution."""
    return dist.ids[draw_index(rng, np.asarray(dist.probs, dtype=np.float64))]


def draw_index(rng: np.random.Generator, weights: np.ndarray) -> int:
    """An index drawn with probability proportional to `weights` (non-negative, not all zero):
    the very draw `rng.choice(len(weights), p=weights / weights.sum())` makes (one uniform, the
    normalised cumulative sum, the first bin past it), so a seed decides the same token, without
    choice's checks of p, which cost twice the draw itself in a generation's few-token blocks."""
    cumulative = np.cumsum(weights / weights.sum())
    cumulative /= cumulative[-1]
    return int(np.searchsorted(cumulative, rng.random(), side="right"))


def race_choice(probs: np.ndarray, clocks: np.ndarray) -> int:
    """The token whose clock rings first when token x's clock runs at rate p(x): argmin E_x / p(x).

    probs (V,) a distribution (warp's output), clocks (V,) independent Exp(1) variates
    (DecisionRandomness.race). E_x / p(x) is exponential with rate p(x), so the first to ring
    is x with probability p(x): a draw from probs, decided by the clocks alone. A drafter that
    runs the same race over its own q picks the same token as often as the two distributions
    allow (about as often as rejection sampling accepts: Daliri, Musco and Suresh 2024,
    "Coupling without communication and drafter-invariant speculative decoding").
    """
    support = np.flatnonzero(probs)  # tokens warp kept
    return int(support[np.argmin(clocks[support] / probs[support])])


def race_choice_sparse(dist: SparseDist, clocks: np.ndarray) -> int:
    """race_choice over a truncated distribution: a drafter's guess at the target's race."""
    ids = np.asarray(dist.ids, dtype=np.int64)
    return int(ids[np.argmin(clocks[ids] / np.asarray(dist.probs, dtype=np.float64))])
