"""Target backends: one model, one forward pass over a block, a KV cache that truncates."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np


class TargetBackend(Protocol):
    """What a session needs from a target model, whatever runs it."""

    name: str  # e.g. "torch:cpu"
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


def load_backend(kind: str, target: str, device: str = "auto") -> TargetBackend:
    """Load a target with the named backend ("torch")."""
    if kind in ("torch", "auto"):
        from remote_verify.backends.torch_backend import TorchTarget

        return TorchTarget(target, device=device)
    raise ValueError(f"unknown backend {kind!r}: choose torch")
