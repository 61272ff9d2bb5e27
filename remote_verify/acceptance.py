"""Acceptance: which draft tokens the target keeps, and the one token it adds.

Pure functions over arrays; no sockets, no models. Greedy is argmax matching. Sampling is
speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023), which leaves
the output distributed exactly as the target's.

Sampling takes its randomness from `draw(i, what)`: a generator for decision `what` about
block position i. The session maps i to the absolute position (wire/randomness.py), so
every draw is a function of what it decides, independent of the drafter's draws.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from wire.protocol import SparseDist
from wire.sampling import draw_index
from wire.randomness import Decision

Draw = Callable[[int, Decision], np.random.Generator]  # (block position, what) -> its generator


def accept_greedy(target_argmax: Sequence[int], draft: Sequence[int]) -> tuple[int, int]:
    """target_argmax (k+1,): the target's choice after each prefix; draft (k,).

    Returns (accepted, token): the longest matching prefix, then the target's own token
    at the first mismatch (or the bonus after a full match).
    """
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target_argmax[accepted]:
        accepted += 1
    return accepted, int(target_argmax[accepted])


def accept_sampled(
    target_probs: Sequence[np.ndarray],  # (k+1, V) warped target distributions p_0 .. p_k, read in order
    draft: Sequence[int],  # (k,) tokens sampled from the draft distributions
    draft_dists: Sequence[SparseDist],  # (k,) the draft distributions q_0 .. q_{k-1}
    draw: Draw,
) -> tuple[int, int]:
    """Speculative rejection sampling over one block; returns (accepted, token)."""
    for i, token in enumerate(draft):
        p = target_probs[i]
        q = _dense(draft_dists[i], p.shape[0])
        # accept x ~ q with probability min(1, p(x) / q(x))
        if draw(i, Decision.ACCEPT).random() * q[token] < p[token]:
            continue
        # rejected: resample from the residual norm(max(0, p - q))
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        if total <= 0.0:  # p == q up to rounding: the residual is empty, fall back to p
            residual, total = p, p.sum()
        return i, draw_index(draw(i, Decision.TOKEN), residual)
    # all accepted: the bonus token comes from the target's next distribution
    k = len(draft)
    bonus = target_probs[k]
    return k, draw_index(draw(k, Decision.TOKEN), bonus)


def _dense(dist: SparseDist, vocab_size: int) -> np.ndarray:
    q = np.zeros(vocab_size, dtype=np.float64)
    q[np.asarray(dist.ids, dtype=np.int64)] = dist.probs
    return q
