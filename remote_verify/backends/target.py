"""The target backends' interface: what a session needs from a target model, one session's
share of a forward pass (a chain, or a tree of guesses where the backend has tree attention),
running several sessions' passes, and the refusal when no cache is left.

The backends and the factory (factory.py) import this module; it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np


class TargetBackend(Protocol):
    """What a session needs from a target model, whatever runs it."""

    name: str  # e.g. "torch:cpu"
    batch_invariant: bool  # a block's logits carry the bits of its tokens decoded one at a time
    vocab_size: int  # rows of the output layer: logits have this many columns
    max_context: int
    bos_id: int
    eos_id: int

    def token_texts(self) -> list[bytes]:
        """Every token's text in id order, for the vocabulary fingerprint."""

    def new_cache(self) -> Any:
        """An empty KV cache for one session."""

    def forward(self, cache: Any, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """Append `tokens` to the cache; return float32 logits (n_logits, V) of the last positions."""

    def truncate(self, cache: Any, length: int) -> None:
        """Drop every cached position from `length` on (roll back without recomputing)."""

    # A backend with tree attention (`tree_attention = True`) also takes passes whose last tokens
    # are a tree of guesses (`Pass.tree`: `forward(..., tree=parents)`), and has
    #     keep_path(cache, length, nodes): keep cached positions 0..length-1, then the tree nodes
    #         `nodes` (indices into the last pass's tree, root first), in that order, and nothing else.
    # One without it is given chains only (the session sends a tree's first-choice path).


class CacheFull(RuntimeError):
    """No KV cache can be allocated for another session now (`new_cache`); the session is
    refused and its client retries later. Sessions already open are never evicted."""


@dataclass
class Pass:
    """One session's share of a forward pass: tokens appended to its cache, results wanted
    for the last `n_logits` positions. With `argmax_only` (greedy verification) a backend
    may return the (n_logits,) argmax ids instead of the (n_logits, V) logits, so that a
    GPU sends a few integers to the host rather than rows of 151,936 floats."""

    cache: Any
    tokens: Sequence[int]
    n_logits: int
    argmax_only: bool = False
    # A tree of guesses: the parents of the last len(tree) tokens (wire/draft_tree.py; -1: the token
    # before them). Node i sees the cache, the tokens before the tree and its own ancestors only, at
    # position (that token's) + its depth; its result row is n_logits - len(tree) + i. None: causal.
    tree: Sequence[int] | None = None


def run_passes(backend: TargetBackend, passes: Sequence[Pass]) -> list[np.ndarray]:
    """Run several sessions' passes: as one batch where the backend has `forward_many`
    (its i-th result is what `forward` gives for passes[i], with the same bits where the
    backend is batch-invariant), else one `forward` after another."""
    forward_many = getattr(backend, "forward_many", None)
    if forward_many is not None:
        return forward_many(passes)
    results = []
    for item in passes:
        if item.tree is not None:
            logits = backend.forward(item.cache, item.tokens, item.n_logits, tree=item.tree)  # (n_logits, V)
        else:
            logits = backend.forward(item.cache, item.tokens, item.n_logits)  # (n_logits, V)
        results.append(logits.argmax(axis=-1) if item.argmax_only else logits)
    return results
