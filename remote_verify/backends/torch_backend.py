"""The PyTorch target backend: a Hugging Face causal LM with a DynamicCache per session.

Batch invariance is off by default here. A matrix product's row comes out differently with
the number of rows on both MKL (CPU: one kernel for 1 row, another for 2-3, a third from 4)
and cuBLAS, so a block scores ~1e-4 logits away from the same tokens decoded one at a time.
Padding every pass to a fixed row count keeps the bits on this MKL but not provably, and
costs more than the block saves; with `batch_invariant=True` a block is decoded token by
token instead: exact by construction, and as slow as the target alone.
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
        log.info("target %s on %s (%s), vocab %d", self.path, self.device, dtype, self.vocab_size)

    def token_texts(self) -> list[bytes]:
        return hf_token_texts(self.path, self.vocab_size)

    def new_cache(self) -> DynamicCache:
        return DynamicCache()

    @torch.inference_mode()
    def forward(self, cache: DynamicCache, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        tokens = list(tokens)
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

    def truncate(self, cache: DynamicCache, length: int) -> None:
        # crop(-n) drops the last n positions in every transformers release we support
        surplus = cache.get_seq_length() - length
        if surplus > 0:
            cache.crop(-surplus)

