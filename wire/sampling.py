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
    """
    assert params.temperature > 0.0, "warp() is for sampling; greedy uses argmax"
    scaled = logits.astype(np.float64) / params.temperature
    vocab = scaled.shape[-1]
    # Ties are broken by token id, lowest first, at every cut (top-k and top-p), so that the
    # kept set is a function of the logits alone and both ends keep the same one. (argpartition
    # alone would pick among tied logits in whatever order its selection left them.)
    if 0 < params.top_k < vocab:
        cut = np.partition(scaled, vocab - params.top_k)[vocab - params.top_k]  # the k-th largest
        above = np.flatnonzero(scaled > cut)  # ascending ids
        at_cut = np.flatnonzero(scaled == cut)[: params.top_k - above.size]  # the lowest ids among ties
        kept = np.concatenate([above, at_cut])
    else:
        kept = np.arange(vocab)
    kept = kept[np.argsort(-scaled[kept], kind="stable")]  # descending; equal logits in ascending id
    kept_logits = scaled[kept]
    kept_probs = np.exp(kept_logits - kept_logits[0])
    kept_probs /= kept_probs.sum()
    if params.top_p < 1.0:
        # Smallest prefix whose mass reaches top_p (the token that crosses it is kept).
        cumulative = np.cumsum(kept_probs)
        n_keep = int(np.searchsorted(cumulative, params.top_p, side="left")) + 1
        kept, kept_probs = kept[:n_keep], kept_probs[:n_keep]
        kept_probs = kept_probs / kept_probs.sum()
    probs = np.zeros(vocab, dtype=np.float64)
    probs[kept] = kept_probs
    return probs


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
