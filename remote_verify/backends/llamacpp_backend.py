"""The llama.cpp target backend: the target GGUF verified by llama.cpp, for hosts without CUDA.

The model's weights are loaded once. Sessions hold slots of a KV pool: a llama.cpp context
of `slots` sequences, each sequence (one session) with a KV stream of its own of
`max_context` cells (`kv_unified = false`). `forward_many` decodes the blocks of several
sessions in one `llama_batch` (one sequence id each, logits only at the positions each
needs), so the weights are read once for all of them; a roll back removes one sequence's
positions (`llama_memory_seq_rm`), no recompute. The service calls this from its single
worker thread only.

KV memory: a pool is allocated whole (its slots x max_context cells, float32 keys and values)
when a session finds no free slot, and freed when its last session closes, so memory grows
and shrinks by pools. Pools grow as sessions come: the first holds one session, each next one
as many as all before it, up to `slots` (1, 1, 2, 4, 8, 8, ...), so a service with one user
(the chat's embedded service) holds one session's cache and no more, and a busy one at most
about twice what its sessions use; the service's --max-sessions bounds the number of pools. A pool that
cannot be allocated refuses the new session (`CacheFull`: the client is told the service's
KV memory is full and when to retry); sessions already open are never evicted.

Why a stream per sequence: attention sums over the cache cells of a stream in cell order, in
SIMD lanes by cell index. In a unified cache a session's cells sit wherever the others left
room, so where it sits (hence its logits' last bits) would depend on its neighbours; in a
stream of its own its cells are 0..n-1 whatever else is decoded, and the cells past them
that a longer neighbour adds to the pass are masked to exact zeros at the end of each sum.
llama.cpp splits such a batch into micro-batches of consecutive sequence ids with an equal
number of tokens each (`split_equal`), so the sessions of a pass are ordered by slot and the
lowest free slot is given out first; blocks of different lengths cost a micro-batch per
length, each one still shared.

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

from remote_verify.backends import CacheFull, Pass
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


SLOTS = 8  # sessions in the largest KV pool: a pass reads the weights once per pool it touches


class KvPool:
    """One llama.cpp context holding `slots` sequences, each in a KV stream of its own."""

    def __init__(self, context: LlamaContext, slots: int):
        self.context = context
        self.memory = llama_cpp.llama_get_memory(context.ctx)
        self.free = list(range(slots))  # sequence ids not in use, lowest first
        self.slots = slots

    @property
    def empty(self) -> bool:
        return len(self.free) == self.slots


@dataclass
class LlamaCache:
    pool: KvPool
    seq: int  # the session's sequence id (and KV stream) in its pool
    length: int = 0  # positions held
    released: bool = False  # its slot was given back (and may be another session's now)


class LlamaCppTarget:
    def __init__(self, path: str | Path, max_context: int = 4096, gpu_layers: int = -1,
                 n_threads: int | None = None, batch_invariant: bool = True, slots: int = SLOTS,
                 grow: bool = True, n_threads_batch: int | None = None):
        if slots < 1:
            raise ValueError(f"a KV pool needs at least one slot, got {slots}")
        self.path = Path(path)
        self.slots = slots  # the largest pool
        self.grow = grow  # pools of 1, 1, 2, 4, ... up to `slots` (False: every pool of `slots`)
        self._pools: list[KvPool] = []
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
        self.n_threads = n_threads or service_threads()  # one-token steps; physical cores: wire/threads.py
        self.n_threads_batch = n_threads_batch or self.n_threads  # blocks: verification, prompts
        offload = llama_cpp.llama_supports_gpu_offload() and gpu_layers != 0
        self.name = f"llamacpp:{'gpu' if offload else 'cpu'}"
        self.batch_invariant = batch_invariant and not offload and not has_llamafile_kernels()
        if batch_invariant and not self.batch_invariant:
            log.warning("verification is not batch-invariant: %s; a greedy near-tie may resolve "
                        "differently with and without speculation", "llama.cpp runs on a GPU"
                        if offload else "llama.cpp was built with llamafile's matrix kernels "
                        "(rebuild it with `bash packaging/install.sh`)")
        self._batch = LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False)  # reused by every decode
        log.info("target %s with llama.cpp (%s, %s), vocab %d", self.path.name, self.name,
                 "batch-invariant" if self.batch_invariant else "batch-shaped kernels", self.vocab_size)

    def token_texts(self) -> list[bytes]:
        return [llama_cpp.llama_vocab_get_text(self._vocab, i) or b"" for i in range(self.vocab_size)]

    def new_cache(self) -> LlamaCache:
        """The lowest free slot of the first pool that has one; a new pool when none has."""
        pool = next((pool for pool in self._pools if pool.free), None)
        if pool is None:
            size = self.slots
            if self.grow:  # as many as the pools so far hold: memory follows the sessions
                size = min(self.slots, max(1, sum(pool.slots for pool in self._pools)))
            pool = KvPool(self._new_context(size), size)
            self._pools.append(pool)
        seq = pool.free.pop(0)
        llama_cpp.llama_memory_seq_rm(pool.memory, seq, -1, -1)  # what a previous session left
        return LlamaCache(pool, seq)

    def context_params(self, slots: int) -> llama_cpp.llama_context_params:
        """A pool's llama.cpp context: `slots` sequences, each in a KV stream of max_context cells."""
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = slots
        params.kv_unified = False  # a KV stream per sequence: see the module docstring
        params.n_ctx = slots * self.max_context  # split evenly between the streams
        params.n_batch = N_BATCH
        params.n_ubatch = N_BATCH
        params.n_threads, params.n_threads_batch = self.n_threads, self.n_threads_batch
        # Batch-invariant attention: flash attention rounds keys and values to float16 and
        # splits a single query's sum over the cache from 512 positions on, so a token
        # would score differently alone and in a block; float32 keys/values and plain
        # attention (a full-length dot product per element) do not. Costs 2x cache memory.
        params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        return params

    def _new_context(self, slots: int) -> LlamaContext:
        params = self.context_params(slots)
        try:
            return LlamaContext(model=self.model, params=params, verbose=False)
        except Exception as exc:  # llama.cpp could not allocate the pool's KV memory
            held = sum(pool.slots for pool in self._pools)
            raise CacheFull(f"the target's KV memory is full ({held} sessions of {self.max_context} tokens "
                            f"in {len(self._pools)} pools): {exc}") from exc

    def forward(self, cache: LlamaCache, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        return self.forward_many([Pass(cache, tokens, n_logits)])[0]

    def forward_many(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        """Every pass's tokens decoded together, a `llama_decode` per pool (a pass reads the
        weights once per pool), in sequence order; returns each pass's (n_logits, V) logits
        or, with argmax_only, its (n_logits,) argmax ids."""
        results: list[list[np.ndarray]] = [[] for _ in passes]
        for problem in (self._pass_problem(item) for item in passes):
            if problem:
                raise ValueError(problem)
        for pool in {id(item.cache.pool): item.cache.pool for item in passes}.values():
            members = sorted((i for i, item in enumerate(passes) if item.cache.pool is pool),
                             key=lambda i: passes[i].cache.seq)
            self._decode_pool(pool, [(i, passes[i]) for i in members], results)
        return [np.array(rows, dtype=np.int64) if item.argmax_only else np.stack(rows)
                for rows, item in zip(results, passes)]

    def _pass_problem(self, item: Pass) -> str:
        if not isinstance(item.cache, LlamaCache) or item.cache.released:
            return "a pass's cache is not a live slot of this backend (was it released?)"
        if not 0 < item.n_logits <= len(item.tokens):
            return f"a pass asks for {item.n_logits} logits of {len(item.tokens)} tokens"
        if item.cache.length + len(item.tokens) > self.max_context:
            return (f"{item.cache.length} cached + {len(item.tokens)} new tokens exceed the context of "
                    f"{self.max_context}")
        return ""

    def _decode_pool(self, pool: KvPool, members: list[tuple[int, Pass]], results: list[list[np.ndarray]]) -> None:
        """Fill llama_batches of up to N_BATCH tokens, member after member, and decode each."""
        batch = self._batch.batch
        outputs: list[tuple[int, int, bool]] = []  # (result index, batch row, argmax only) of this decode
        advanced: list[tuple[LlamaCache, int]] = []  # (cache, tokens) this decode appends
        n = 0

        def decode() -> None:
            nonlocal n
            batch.n_tokens = n
            pool.context.decode(self._batch)
            for cache, count in advanced:
                cache.length += count
            for index, row, argmax_only in outputs:
                logits = self._logits_view(pool, row)
                results[index].append(np.int64(logits.argmax()) if argmax_only else logits.copy())
            outputs.clear()
            advanced.clear()
            n = 0

        for index, item in members:
            cache, tokens = item.cache, list(item.tokens)
            first_output = len(tokens) - item.n_logits
            position, count = cache.length, 0
            for j, token in enumerate(tokens):
                if n == N_BATCH:
                    advanced.append((cache, count))
                    decode()
                    position, count = cache.length, 0
                batch.token[n] = token
                batch.pos[n] = position + count
                batch.seq_id[n][0] = cache.seq
                batch.n_seq_id[n] = 1
                batch.logits[n] = j >= first_output
                if j >= first_output:
                    outputs.append((index, n, item.argmax_only))
                n += 1
                count += 1
            advanced.append((cache, count))
        if n:
            decode()

    def truncate(self, cache: LlamaCache, length: int) -> None:
        if cache.released:
            raise ValueError("truncating a released cache")
        # Always removed, not only below the known length: after a failed decode the cache may
        # hold positions that `length` never counted.
        llama_cpp.llama_memory_seq_rm(cache.pool.memory, cache.seq, length, -1)
        cache.length = min(cache.length, length)

    def release(self, cache: LlamaCache) -> None:
        """Give the session's slot back; a pool left empty is freed (its memory goes back now)."""
        pool = cache.pool
        if cache.released:
            return
        cache.released = True
        llama_cpp.llama_memory_seq_rm(pool.memory, cache.seq, -1, -1)
        pool.free.append(cache.seq)
        pool.free.sort()
        cache.length = 0
        if pool.empty:
            self._pools.remove(pool)
            pool.context.close()

    def _logits_view(self, pool: KvPool, row: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(pool.context.ctx, row)
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.vocab_size,))
