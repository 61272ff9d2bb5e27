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
    if 0 < params.top_k < vocab:
        # Keep the k largest; order among equal logits at the cut follows token id.
        kept = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    else:
        kept = np.arange(vocab)
    kept = kept[np.argsort(-scaled[kept], kind="stable")]  # descending
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
    probs = np.asarray(dist.probs, dtype=np.float64)
    return dist.ids[int(rng.choice(len(probs), p=probs / probs.sum()))]
