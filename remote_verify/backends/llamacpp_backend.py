"""The llama.cpp target backend: the target GGUF verified by llama.cpp, for hosts without CUDA.

The model's weights are loaded once; every session gets its own llama.cpp context (its own
KV cache). A round decodes the block in one batch, asking llama.cpp for logits at the last
positions only; a roll back removes cache positions (`llama_memory_seq_rm`), no recompute.
The service calls this from its single worker thread only.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from wire.threads import quiet_openmp, service_threads

quiet_openmp()  # before llama.cpp's OpenMP runtime loads: it reads the wait policy only then

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402
from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel  # noqa: E402
from llama_cpp._logger import set_verbose  # noqa: E402

log = logging.getLogger(__name__)

N_BATCH = 512  # tokens per llama_decode call; a draft block is always far smaller


@dataclass
class LlamaCache:
    context: LlamaContext
    batch: LlamaBatch
    length: int = 0  # positions held


class LlamaCppTarget:
    def __init__(self, path: str | Path, max_context: int = 4096, gpu_layers: int = -1,
                 n_threads: int | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"the llama.cpp backend needs a GGUF file; {self.path} is not one")
        set_verbose(log.isEnabledFor(logging.DEBUG))  # llama.cpp's own log, off unless debugging
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = gpu_layers  # -1: all layers on the GPU when llama.cpp has one
        self.model = LlamaModel(path_model=str(self.path), params=params, verbose=False)
        self._vocab = llama_cpp.llama_model_get_vocab(self.model.model)
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.max_context = min(max_context, int(llama_cpp.llama_model_n_ctx_train(self.model.model)))
        self.bos_id = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos_id = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.n_threads = n_threads or service_threads()  # physical cores: wire/threads.py
        offload = llama_cpp.llama_supports_gpu_offload() and gpu_layers != 0
        self.name = f"llamacpp:{'gpu' if offload else 'cpu'}"
        log.info("target %s with llama.cpp (%s), vocab %d", self.path.name, self.name, self.vocab_size)

    def token_texts(self) -> list[bytes]:
        return [llama_cpp.llama_vocab_get_text(self._vocab, i) or b"" for i in range(self.vocab_size)]

    def new_cache(self) -> LlamaCache:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.max_context
        params.n_batch = N_BATCH
        params.n_ubatch = N_BATCH
        params.n_threads = params.n_threads_batch = self.n_threads
        # Batch-invariant numerics: a block verified at once must score like the same tokens
        # decoded one by one. llama.cpp's defaults (float16 cache, flash attention, which
        # rounds queries to half precision on the CPU) move logits by ~1e-2 between batch
        # shapes, enough to flip near-ties; float32 keys/values and plain attention keep
        # them within ~1e-5. Costs 2x cache memory.
        params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        context = LlamaContext(model=self.model, params=params, verbose=False)
        return LlamaCache(context, LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False))

    def forward(self, cache: LlamaCache, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        tokens = list(tokens)
        head, tail = tokens[: max(0, len(tokens) - N_BATCH)], tokens[-N_BATCH:]
        for start in range(0, len(head), N_BATCH):
            self._decode(cache, head[start:start + N_BATCH], n_logits=0)
        self._decode(cache, tail, n_logits)
        first = len(tail) - n_logits
        rows = [self._logits(cache, i) for i in range(first, len(tail))]
        return np.stack(rows)  # (n_logits, V)

    def truncate(self, cache: LlamaCache, length: int) -> None:
        if length < cache.length:
            cache.context.kv_cache_seq_rm(0, length, -1)
            cache.length = length

    def release(self, cache: LlamaCache) -> None:
        """Free the session's context and batch now rather than whenever they are collected."""
        cache.context.close()
        cache.batch.close()

    def _decode(self, cache: LlamaCache, tokens: list[int], n_logits: int) -> None:
        batch = cache.batch.batch
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = cache.length + i
            batch.seq_id[i][0] = 0
            batch.n_seq_id[i] = 1
            batch.logits[i] = i >= len(tokens) - n_logits
        cache.context.decode(cache.batch)
        cache.length += len(tokens)

    def _logits(self, cache: LlamaCache, index: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(cache.context.ctx, index)
        return np.ctypeslib.as_array(
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.vocab_size,)).copy()
