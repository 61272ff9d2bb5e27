"""The llama.cpp target backend: the target GGUF verified by llama.cpp, for hosts without CUDA.

The model's weights are loaded once. Sessions hold slots of a KV pool: a llama.cpp context
of `slots` sequences, each sequence (one session) with a KV stream of its own of
`max_context` cells (`kv_unified = false`). `forward_many` decodes the blocks of several
sessions in one `llama_batch` (one sequence id each, logits only at the positions each
needs), so the weights are read once for all of them; a roll back removes one sequence's
positions (`llama_memory_seq_rm`), no recompute. The service calls this from its single
worker thread only.

No tree attention (the session sends a tree's first-choice path): llama.cpp's way to a tree is a
token in the sequences of every leaf below it, which needs a sequence per branch sharing one KV
stream, while each session here is one sequence in a stream of its own (below: batch invariance).

KV memory: a pool is allocated whole (its slots x max_context cells, float32 keys and values).
A service's sessions live in one pool as long as it can hold them, because a pass runs one
`llama_decode` per pool it touches: a pool of 1 slot for the first session, and when it is
full, one of twice as many slots into which every session moves (its cells copied with
`llama_state_seq_get_data`/`set_data`, bit for bit, at the same positions), up to `slots`
(every session of the service on a GPU; on the CPU as many as 2 GiB hold, CPU_POOL_BYTES,
since allocating a pool holds every session); only then a second pool starts. When a pool's
sessions fall to a quarter of its slots they move into one just big enough for them, and a
pool whose last session closes is freed, both after a while (below), so memory follows the
sessions both ways (at most twice what they use, three times for the moment of a move, more
for POOL_KEEP_S after sessions leave). A pool that cannot be allocated
refuses the new session (`CacheFull`: the client is told the service's KV memory is full and
when to retry); sessions already open are never evicted, and a move that fails leaves them
where they were. On the CPU "cannot be allocated" is decided before llama.cpp is asked: a pool
larger than the memory the machine has left is refused (remote_verify/memory.py), because Linux
lets such an allocation succeed and its OOM killer then ends the service with every session in
it. Where a doubled pool does not fit, the newcomer gets a pool of 1 of its own if that does.

Pools shrink late, not at once: a few sessions opening and closing around a grow and a shrink
point made the device thread allocate, zero and copy whole pools over and over (3.3 GB a cycle
for the default 1.5B), holding every other session meanwhile. So a pool left empty, or at a
quarter of its slots or fewer, is kept as it is for POOL_KEEP_S, and new sessions take its free
slots; `tidy()` (the service calls it every few seconds) frees or shrinks it once it has been
that quiet that long. When the service's last session closes, every pool is freed at once:
nobody is left to be held up by an allocation, and memory goes back to the baseline.

Why a stream per sequence: attention sums over the cache cells of a stream in cell order, in
SIMD lanes by cell index. In a unified cache a session's cells sit wherever the others left
room, so where it sits (hence its logits' last bits) would depend on its neighbours; in a
stream of its own its cells are 0..n-1 whatever else is decoded, and the cells past them
that a longer neighbour adds to the pass are masked to exact zeros at the end of each sum.
llama.cpp splits such a batch into micro-batches of consecutive sequence ids with an equal
number of tokens each (`split_equal`), each paying a graph run; `llama_pass_plan.py` pads
blocks and fills the idle streams between members where that makes a pass one micro-batch for
less than the micro-batches it saves (the pad tokens are removed after the pass).

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
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from remote_verify.backends.llama_pass_plan import DecodeCosts, PassLayout, plan_lengths, ubatch_count
from remote_verify.backends.target import CacheFull, Pass
from remote_verify.memory import allocation_problem
from wire.llama_switches import prepare_llama_cpp
from wire.threads import service_threads

prepare_llama_cpp()  # before llama.cpp loads: switches it reads once per process

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402
from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel  # noqa: E402
from llama_cpp._logger import set_verbose  # noqa: E402

log = logging.getLogger(__name__)

N_BATCH = 512  # tokens per llama_decode call; a draft block is always far smaller
PAD_TOKEN = 0  # what padding feeds: never attended to by a real token, removed after the pass
PADDING = ("auto", "never", "always")  # by the learned prices; as sent; whenever it saves a micro-batch


def restream(state: bytes, seq: int, streams: int) -> bytes:
    """A sequence's saved KV state (`llama_state_seq_get_data` of a context with a stream per
    sequence) laid out for a context of `streams` streams. The state is a magic number and the
    sequence id, the stream count, then each stream's cell count and, where it is not 0, its
    cells (src/llama-context.cpp, src/llama-kv-cache.cpp: state_write). A sequence's cells are
    all in its own stream, and llama.cpp restores them into the destination sequence's stream
    whichever entry holds them, but refuses a state whose stream count is not its own."""
    word = struct.Struct("<I")
    prefix = 2 * word.size  # the magic number and the sequence id
    (saved_streams,) = word.unpack_from(state, prefix)
    start = prefix + word.size * (1 + seq)
    end = len(state) - word.size * (saved_streams - seq - 1)
    if any(state[prefix + word.size:start]) or any(state[end:]):
        raise ValueError(f"sequence {seq}'s saved state holds cells outside its own stream")
    return state[:prefix] + word.pack(streams) + state[start:end] + bytes(word.size * (streams - 1))


def has_llamafile_kernels() -> bool:
    """Whether this llama.cpp build multiplies float matrices of 2+ rows with tinyBLAS."""
    probe = getattr(llama_cpp.llama_cpp._lib, "ggml_cpu_has_llamafile", None)
    return bool(probe()) if probe is not None else False


# The largest KV pool on the CPU: allocating and zeroing a pool's memory holds the device thread,
# and with it every session, for about a second a GB here and more beyond (the 1.5B target at
# 4,096 tokens: 8 slots, 1.9 GB, 1.4 s; 16 slots, 3.8 GB, 6.2 s), so a pool takes as many sessions
# as fit in this much (the 1.5B at 4,096 tokens: 9; the tiny test model: every one). On a GPU a
# pool is a device allocation, quick: every session of the service fits one.
CPU_POOL_BYTES = 2 << 30
MAX_SLOTS = 256  # llama.cpp's LLAMA_MAX_SEQ: sequences a context can hold
POOL_KEEP_S = 30.0  # an empty or mostly empty pool is kept this long before tidy() frees or shrinks it


class KvPool:
    """One llama.cpp context holding `slots` sequences, each in a KV stream of its own."""

    def __init__(self, context: LlamaContext, slots: int):
        self.context = context
        self.memory = llama_cpp.llama_get_memory(context.ctx)
        self.live: dict[int, LlamaCache] = {}  # sequence id -> the session's cache
        self.slots = slots
        self.quiet_since: float | None = None  # since when it has been empty or at a quarter of its slots

    def note_use(self, grow: bool) -> None:
        """Start or stop its quiet clock by how many slots are in use now."""
        quiet = self.empty or (grow and len(self.live) <= self.slots // 4)
        self.quiet_since = (self.quiet_since or time.monotonic()) if quiet else None

    @property
    def free(self) -> list[int]:
        """Sequence ids not in use, lowest first."""
        return [seq for seq in range(self.slots) if seq not in self.live]

    @property
    def empty(self) -> bool:
        return not self.live


@dataclass
class LlamaCache:
    pool: KvPool
    seq: int  # the session's sequence id (and KV stream) in its pool
    length: int = 0  # positions held
    released: bool = False  # its slot was given back (and may be another session's now)


class LlamaCppTarget:
    def __init__(self, path: str | Path, max_context: int = 4096, gpu_layers: int = -1,
                 n_threads: int | None = None, batch_invariant: bool = True, slots: int | None = None,
                 grow: bool = True, n_threads_batch: int | None = None, padding: str = "auto",
                 sessions: int = 32):
        if slots is not None and not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"a KV pool holds 1 to {MAX_SLOTS} sessions, got {slots}")
        if padding not in PADDING:
            raise ValueError(f"padding is one of {', '.join(PADDING)}, got {padding!r}")
        self.path = Path(path)
        self.grow = grow  # a pool of 1 that doubles up to `slots` (False: every pool of `slots`)
        self.padding = padding
        self.costs = DecodeCosts()  # what a micro-batch and a token cost here, from the decodes run
        self.padded_tokens = 0  # computed for nothing, to make passes one micro-batch (/metrics, benchmarks.load)
        self.ubatches = 0  # micro-batches run (/metrics: specwire_target_micro_batches)
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
        self._logits_row = ctypes.c_float * self.vocab_size  # a row of llama.cpp's logits, read by address
        self.max_context = min(max_context, int(llama_cpp.llama_model_n_ctx_train(self.model.model)))
        offload = llama_cpp.llama_supports_gpu_offload() and gpu_layers != 0
        if slots is None:  # `sessions`: the service's --max-sessions
            fit = MAX_SLOTS if offload else max(1, CPU_POOL_BYTES // self.kv_bytes_per_session())
            slots = max(1, min(sessions, fit, MAX_SLOTS))
        self.slots = slots  # the largest pool
        self.bos_id = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos_id = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.n_threads = n_threads or service_threads()  # one-token steps; physical cores: wire/threads.py
        self.n_threads_batch = n_threads_batch or self.n_threads  # blocks: verification, prompts
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

    @property
    def kv_slots(self) -> int:
        """The sessions' slots allocated in every pool (/metrics: specwire_kv_cache_slots)."""
        return sum(pool.slots for pool in self._pools)

    def kv_bytes_per_session(self) -> int:
        """A slot's KV memory: max_context positions of float32 keys and values in every layer."""
        model = self.model.model
        head_dim = llama_cpp.llama_model_n_embd(model) // llama_cpp.llama_model_n_head(model)
        per_position = llama_cpp.llama_model_n_layer(model) * 2 * llama_cpp.llama_model_n_head_kv(model) * head_dim * 4
        return self.max_context * per_position

    def token_texts(self) -> list[bytes]:
        return [llama_cpp.llama_vocab_get_text(self._vocab, i) or b"" for i in range(self.vocab_size)]

    def new_cache(self) -> LlamaCache:
        """The lowest free slot of the first pool that has one; when none has, the newest pool
        doubles (its sessions move) or, at `slots`, a new pool of 1 (of `slots` without grow)."""
        pool = next((pool for pool in self._pools if pool.free), None)
        if pool is None:
            newest = self._pools[-1] if self._pools else None
            pool = None
            if self.grow and newest is not None and newest.slots < self.slots:
                try:
                    pool = self._move_sessions(newest, min(self.slots, 2 * newest.slots))
                except CacheFull as exc:
                    log.info("no memory to grow a KV pool (%s): the new session takes a pool of its own", exc)
            if pool is None:
                size = 1 if self.grow else self.slots
                pool = KvPool(self._new_context(size), size)
                self._pools.append(pool)
        seq = pool.free[0]
        llama_cpp.llama_memory_seq_rm(pool.memory, seq, -1, -1)  # what a previous session left
        cache = LlamaCache(pool, seq)
        pool.live[seq] = cache
        pool.note_use(self.grow)
        return cache

    def _move_sessions(self, pool: KvPool, size: int) -> KvPool:
        """Every session of `pool` into a new pool of `size` slots, in the order of their sequence
        ids and from 0 on (their cells copied bit for bit, at the same positions); the old pool is
        freed. A pool that cannot be allocated raises CacheFull and moves nobody."""
        moved = KvPool(self._new_context(size), size)
        for new_seq, (old_seq, cache) in enumerate(sorted(pool.live.items())):
            if llama_cpp.llama_memory_seq_pos_max(pool.memory, old_seq) < 0:
                continue  # holds no cell: nothing to copy
            state_size = llama_cpp.llama_state_seq_get_size(pool.context.ctx, old_seq)
            state = (ctypes.c_uint8 * max(state_size, 1))()
            written = llama_cpp.llama_state_seq_get_data(pool.context.ctx, state, state_size, old_seq)
            restated = restream(bytes(state)[:written], old_seq, size)
            source = (ctypes.c_uint8 * len(restated)).from_buffer_copy(restated)
            if llama_cpp.llama_state_seq_set_data(moved.context.ctx, source, len(restated), new_seq) == 0:
                moved.context.close()
                raise CacheFull(f"could not move a session's {cache.length} cached tokens into a pool of {size}")
        for new_seq, (_, cache) in enumerate(sorted(pool.live.items())):
            cache.pool, cache.seq = moved, new_seq
            moved.live[new_seq] = cache
        self._pools[self._pools.index(pool)] = moved
        pool.context.close()
        log.debug("KV pool of %d slots -> %d (%d sessions moved)", pool.slots, size, len(moved.live))
        return moved

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
        held = sum(pool.slots for pool in self._pools)
        if self.name.endswith(":cpu"):
            problem = allocation_problem(slots * self.kv_bytes_per_session(), f"a KV pool of {slots} sessions")
            if problem:
                log.warning("refused a new KV pool: %s (%d slots of %d tokens held in %d pools)", problem, held,
                            self.max_context, len(self._pools))
                raise CacheFull(f"the target's KV memory is full: {problem}")
        try:
            return LlamaContext(model=self.model, params=params, verbose=False)
        except Exception as exc:  # llama.cpp could not allocate the pool's KV memory
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

    def _layout(self, pool: KvPool, members: list[tuple[int, Pass]]) -> PassLayout:
        """How many tokens each sequence of the pool feeds in this pass (llama_pass_plan.py)."""
        real = {item.cache.seq: len(item.tokens) for _, item in members}
        if self.padding == "never" or len(real) == 1:
            return PassLayout(real, ubatch_count(real, N_BATCH))
        room = {seq: self.max_context - (pool.live[seq].length if seq in pool.live else 0)
                for seq in range(pool.slots)}
        per_ubatch, per_token = (1.0, 0.0) if self.padding == "always" else self.costs.prices
        return plan_lengths(real, room, per_ubatch, per_token, N_BATCH)

    def _decode_pool(self, pool: KvPool, members: list[tuple[int, Pass]], results: list[list[np.ndarray]]) -> None:
        """Fill llama_batches of up to N_BATCH tokens, sequence after sequence in id order (the
        layout's padding included), and decode each; padding is removed after its decode."""
        batch = self._batch.batch
        layout = self._layout(pool, members)
        by_seq = {item.cache.seq: (index, item) for index, item in members}
        outputs: list[tuple[int, int, bool]] = []  # (result index, batch row, argmax only) of this decode
        advanced: list[tuple[LlamaCache, int]] = []  # (cache, real tokens) this decode appends
        padded: list[tuple[int, int]] = []  # (sequence id, first padded position) to remove after it
        fed: dict[int, int] = {}  # tokens of each sequence in this decode: its micro-batches
        n = 0

        def decode() -> None:
            nonlocal n
            batch.n_tokens = n
            started = time.perf_counter()
            try:
                pool.context.decode(self._batch)
            finally:  # a failed decode too: a filled stream is another session's, and must stay as it was
                for seq, first in padded:
                    llama_cpp.llama_memory_seq_rm(pool.memory, seq, first, -1)
            ubatches = ubatch_count(fed, N_BATCH)
            self.ubatches += ubatches
            if n > 1:  # a one-token step runs on n_threads, not n_threads_batch: another price
                self.costs.observe(ubatches, n, time.perf_counter() - started)
            for cache, count in advanced:
                cache.length += count
            for index, row, argmax_only in outputs:
                logits = self._logits_view(pool, row)
                results[index].append(np.int64(logits.argmax()) if argmax_only else logits.copy())
            for part in (outputs, advanced, padded):
                part.clear()
            fed.clear()
            n = 0

        for seq, length in sorted(layout.lengths.items()):
            index, item = by_seq.get(seq, (None, None))
            cache = item.cache if item is not None else pool.live.get(seq)
            tokens = list(item.tokens) if item is not None else []
            self.padded_tokens += length - len(tokens)
            first_output = len(tokens) - item.n_logits if item is not None else len(tokens)
            start, count = (cache.length if cache is not None else 0), 0
            for j in range(length):
                if n == N_BATCH:  # only an unpadded layout is this long (plan_lengths)
                    if cache is not None and item is not None:
                        advanced.append((cache, count))
                    decode()
                    start, count = (cache.length if cache is not None else 0), 0
                real = j < len(tokens)
                batch.token[n] = tokens[j] if real else PAD_TOKEN
                batch.pos[n] = start + count
                batch.seq_id[n][0] = seq
                batch.n_seq_id[n] = 1
                batch.logits[n] = real and j >= first_output
                if real and j >= first_output:
                    outputs.append((index, n, item.argmax_only))
                fed[seq] = fed.get(seq, 0) + 1
                n += 1
                count += 1
            if item is not None:  # a padded layout fits one decode: its pad tokens are all in this one
                advanced.append((cache, count - (length - len(tokens))))
            if length > len(tokens):  # pad tokens sit after the real ones, from start + len(tokens) on
                padded.append((seq, start + len(tokens)))
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
        """Give the session's slot back. Its pool is kept (see the module docstring: `tidy` frees or
        shrinks it later), unless no session is left in any pool: then every pool is freed now."""
        pool = cache.pool
        if cache.released:
            return
        cache.released = True
        llama_cpp.llama_memory_seq_rm(pool.memory, cache.seq, -1, -1)
        del pool.live[cache.seq]
        cache.length = 0
        pool.note_use(self.grow)
        if all(each.empty for each in self._pools):
            for each in self._pools:
                each.context.close()
            self._pools.clear()

    def tidy(self, now: float | None = None) -> bool:
        """Free each pool that has been empty for POOL_KEEP_S, and move the sessions of one at a quarter
        of its slots or fewer that long into a pool just big enough (where that pool cannot be
        allocated they stay). True when memory was given back."""
        now = time.monotonic() if now is None else now
        changed = False
        for pool in list(self._pools):
            if pool.quiet_since is None or now - pool.quiet_since < POOL_KEEP_S:
                continue
            if pool.empty:
                self._pools.remove(pool)
                pool.context.close()
                changed = True
            elif self.grow and len(pool.live) <= pool.slots // 4:
                size = 1 << (len(pool.live) - 1).bit_length()  # the power of two that holds them
                try:
                    self._move_sessions(pool, size).note_use(self.grow)
                    changed = True
                except CacheFull as exc:
                    log.warning("KV pool of %d slots kept for %d sessions: %s", pool.slots, len(pool.live), exc)
                    pool.quiet_since = now  # try again after another while
        return changed

    def _logits_view(self, pool: KvPool, row: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(pool.context.ctx, row)
        # by address: np.ctypeslib.as_array builds an array interface on every call (9 us against 3)
        return np.frombuffer(self._logits_row.from_address(ctypes.addressof(pointer.contents)), np.float32)
