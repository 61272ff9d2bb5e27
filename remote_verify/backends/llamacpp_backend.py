"""The llama.cpp target backend: the target GGUF verified by llama.cpp, for hosts without CUDA.

The model's weights are loaded once; every session gets its own llama.cpp context (its own
KV cache). A round decodes the block in one batch, asking llama.cpp for logits at the last
positions only; a roll back removes cache positions (`llama_memory_seq_rm`), no recompute.
The service calls this from its single worker thread only.

Batch invariance (on by default): a verified block must score exactly like the same tokens
decoded one at a time, or a greedy near-tie can resolve differently with and without
speculation. Three llama.cpp CPU kernels depend on the batch shape, each off here:
- llamafile's tinyBLAS GEMM, taken for every float matrix product of two rows or more
  (among them attention's scores-times-values): not built (`packaging/install.sh` passes
  `-DGGML_LLAMAFILE=OFF`; a build that has it is reported at load);
- repacked Q4_0/Q4_K weights, multiplied four rows at a time with a remainder done row by
  row: `use_extra_bufts = False`;
- the tiled K-quant matrix product for eight rows or more: `GGML_CPU_TILED_MM=0`, read once
  per process at the first matrix product, so it is set before this backend decodes.
What remains (`vec_dot` per output element, row-local norms, RoPE and softmax) gives a row
the same bits whatever the batch. The cost (`python -m benchmarks.batch_noise --cost`) is
paid on every pass; `specwire serve --no-batch-invariant` trades exactness at near-ties for it.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from wire.llama_switches import prepare_llama_cpp
from wire.threads import service_threads

prepare_llama_cpp()  # before llama.cpp loads: switches it reads once per process

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402
from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel  # noqa: E402
from llama_cpp._logger import set_verbose  # noqa: E402

log = logging.getLogger(__name__)

N_BATCH = 512  # tokens per llama_decode call; a draft block is always far smaller


def has_llamafile_kernels() -> bool:
    """Whether this llama.cpp build multiplies float matrices of 2+ rows with tinyBLAS."""
    probe = getattr(llama_cpp.llama_cpp._lib, "ggml_cpu_has_llamafile", None)
    return bool(probe()) if probe is not None else False


@dataclass
class LlamaCache:
    context: LlamaContext
    batch: LlamaBatch
    length: int = 0  # positions held


class LlamaCppTarget:
    def __init__(self, path: str | Path, max_context: int = 4096, gpu_layers: int = -1,
                 n_threads: int | None = None, batch_invariant: bool = True):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"the llama.cpp backend needs a GGUF file; {self.path} is not one")
        set_verbose(log.isEnabledFor(logging.DEBUG))  # llama.cpp's own log, off unless debugging
        # Read at the process's first matrix product: decides in a service (this is its first
        # model); in a process that computed already, the value set at import stays.
        os.environ["GGML_CPU_TILED_MM"] = "0" if batch_invariant else "1"
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = gpu_layers  # -1: all layers on the GPU when llama.cpp has one
        params.use_extra_bufts = not batch_invariant  # repacked weights: gemm by 4 rows, gemv for the rest
        self.model = LlamaModel(path_model=str(self.path), params=params, verbose=False)
        self._vocab = llama_cpp.llama_model_get_vocab(self.model.model)
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.max_context = min(max_context, int(llama_cpp.llama_model_n_ctx_train(self.model.model)))
        self.bos_id = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos_id = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.n_threads = n_threads or service_threads()  # physical cores: wire/threads.py
        offload = llama_cpp.llama_supports_gpu_offload() and gpu_layers != 0
        self.name = f"llamacpp:{'gpu' if offload else 'cpu'}"
        self.batch_invariant = batch_invariant and not offload and not has_llamafile_kernels()
        if batch_invariant and not self.batch_invariant:
            log.warning("verification is not batch-invariant: %s; a greedy near-tie may resolve "
                        "differently with and without speculation", "llama.cpp runs on a GPU"
                        if offload else "llama.cpp was built with llamafile's matrix kernels "
                        "(rebuild it with `bash packaging/install.sh`)")
        log.info("target %s with llama.cpp (%s, %s), vocab %d", self.path.name, self.name,
                 "batch-invariant" if self.batch_invariant else "batch-shaped kernels", self.vocab_size)

    def token_texts(self) -> list[bytes]:
        return [llama_cpp.llama_vocab_get_text(self._vocab, i) or b"" for i in range(self.vocab_size)]

    def new_cache(self) -> LlamaCache:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.max_context
        params.n_batch = N_BATCH
        params.n_ubatch = N_BATCH
        params.n_threads = params.n_threads_batch = self.n_threads
        # Batch-invariant attention: flash attention rounds keys and values to float16 and
        # splits a single query's sum over the cache from 512 positions on, so a token
        # would score differently alone and in a block; float32 keys/values and plain
        # attention (a full-length dot product per element) do not. Costs 2x cache memory.
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
