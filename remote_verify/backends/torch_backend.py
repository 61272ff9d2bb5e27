"""The PyTorch target backend: a Hugging Face causal LM with a DynamicCache per session.

Batch invariance is off by default here. A matrix product's row comes out differently with
the number of rows on both MKL (CPU: one kernel for 1 row, another for 2-3, a third from 4)
and cuBLAS, so a block scores ~1e-4 logits away from the same tokens decoded one at a time.
Padding every pass to a fixed row count keeps the bits on this MKL but not provably, and
costs more than the block saves; with `batch_invariant=True` a block is decoded token by
token instead: exact by construction, and as slow as the target alone.

Tree attention (a pass whose guesses are a tree: remote_verify/backends/target.py `Pass.tree`)
is a 4D additive mask and explicit position ids handed to the Hugging Face model: each node
sees the cache, the tokens before the tree and its own ancestors, at the position of its
depth. Its keys and values land in the cache in node order; `keep_path` then keeps the
history and the kept path only, moved together (their rotary positions are those of the
path already). Not in the batch-invariant mode, which decodes a token at a time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from models.gguf_to_hf import ensure_converted
from models.vocab import hf_token_texts

log = logging.getLogger(__name__)


class TorchTarget:
    def __init__(self, path: str | Path, device: str = "auto", dtype: torch.dtype | None = None,
                 batch_invariant: bool = False):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
        self.device = torch.device(device)
        # float32 on the CPU (half precision is slow on most CPUs); bfloat16 on a GPU
        dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
        path = Path(path)
        if path.is_file():  # a GGUF target: de-quantized once, then loaded from the cache
            path = ensure_converted(path, str(dtype).removeprefix("torch."))
        self.path = path
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"no Hugging Face model at {self.path} (config.json missing)")
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype).to(self.device).eval()
        config = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.max_context = int(getattr(config, "max_position_embeddings", 4096))
        self.bos_id = int(config.bos_token_id) if config.bos_token_id is not None else -1
        eos = config.eos_token_id
        self.eos_id = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else -1
        self.name = f"torch:{self.device.type}"
        self.batch_invariant = batch_invariant
        self.tree_attention = not batch_invariant
        log.info("target %s on %s (%s), vocab %d", self.path, self.device, dtype, self.vocab_size)

    def token_texts(self) -> list[bytes]:
        return hf_token_texts(self.path, self.vocab_size)

    def new_cache(self) -> DynamicCache:
        return DynamicCache()

    @torch.inference_mode()
    def forward(self, cache: DynamicCache, tokens: Sequence[int], n_logits: int,
                tree: Sequence[int] | None = None) -> np.ndarray:
        tokens = list(tokens)
        if tree is not None:
            return self._forward_tree(cache, tokens, n_logits, list(tree))
        if self.batch_invariant and n_logits > 1:
            head = tokens[:len(tokens) - n_logits]
            rows = [self._forward(cache, head + tokens[len(head):len(head) + 1], 1)]
            rows += [self._forward(cache, [token], 1) for token in tokens[len(head) + 1:]]
            return np.concatenate(rows)
        return self._forward(cache, tokens, n_logits)

    def _forward(self, cache: DynamicCache, tokens: list[int], n_logits: int) -> np.ndarray:
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                         logits_to_keep=n_logits)
        return out.logits[0, -n_logits:].float().cpu().numpy()  # (n_logits, V)

    def _forward_tree(self, cache: DynamicCache, tokens: list[int], n_logits: int, parents: list[int]) -> np.ndarray:
        past = cache.get_seq_length()
        mask, positions = tree_mask(past, len(tokens), parents)  # (n, past + n) bool, (n,)
        additive = torch.zeros(mask.shape, dtype=self.model.dtype)
        additive[~mask] = torch.finfo(self.model.dtype).min
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=n_logits,
                         attention_mask=additive[None, None].to(self.device),
                         position_ids=positions[None].to(self.device))
        return out.logits[0, -n_logits:].float().cpu().numpy()  # (n_logits, V)

    def keep_path(self, cache: DynamicCache, length: int, nodes: Sequence[int]) -> None:
        """Keep cached positions 0..length-1 and then the tree nodes `nodes` of the last pass (whose
        tree began where the history ends: node i at cell length + i), dropping every other node."""
        keep = torch.cat([torch.arange(length), length + torch.tensor(list(nodes), dtype=torch.long)])
        keep = keep.to(self.device)
        for layer in kv_layers(cache):
            layer.keys = layer.keys.index_select(-2, keep)  # (1, heads, cells, head_dim)
            layer.values = layer.values.index_select(-2, keep)

    def truncate(self, cache: DynamicCache, length: int) -> None:
        # crop(-n) drops the last n positions in every transformers release we support
        surplus = cache.get_seq_length() - length
        if surplus > 0:
            cache.crop(-surplus)



def tree_mask(past: int, n: int, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Who sees whom in a pass of `n` tokens after `past` cached ones whose last len(parents) are a
    tree: (n, past + n) bool (True: may attend) and each token's position (n,). The tokens before
    the tree are causal; node i sees them, its ancestors and itself, at their last position + depth."""
    head = n - len(parents)  # tokens before the tree (at least the last committed one)
    mask = torch.ones(n, past + n, dtype=torch.bool).tril(past)  # causal: row r sees columns <= past + r
    positions = torch.arange(past, past + n)
    for i, parent in enumerate(parents):
        row = head + i
        mask[row, past + head:] = False
        if parent >= 0:
            mask[row, past + head:past + head + parent + 1] = mask[head + parent, past + head:past + head + parent + 1]
            positions[row] = positions[head + parent] + 1
        else:
            positions[row] = past + head
        mask[row, past + row] = True
    return mask, positions


def kv_layers(cache: DynamicCache) -> list:
    """The cache's layers, each with `keys` and `values` (batch, heads, cells, head_dim) to assign."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers
    return [_LegacyLayer(cache, i) for i in range(len(cache.key_cache))]  # transformers before 4.54


class _LegacyLayer:
    """A layer of a DynamicCache that keeps its tensors in key_cache / value_cache lists."""

    def __init__(self, cache, index: int):
        self.cache, self.index = cache, index

    @property
    def keys(self):
        return self.cache.key_cache[self.index]

    @keys.setter
    def keys(self, value):
        self.cache.key_cache[self.index] = value

    @property
    def values(self):
        return self.cache.value_cache[self.index]

    @values.setter
    def values(self, value):
        self.cache.value_cache[self.index] = value
