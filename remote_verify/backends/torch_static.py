"""The static-cache torch target: a KV slot per session, many sessions' passes in one forward.

The path a serving engine takes instead of Hugging Face eager with a DynamicCache:
- the KV cache is allocated once (qwen2_static.StaticKV): `new_cache` hands out a slot,
  `release` (or the cache object being collected) gives it back, and `truncate` only moves
  the slot's length. With every slot taken, `new_cache` raises NoFreeSlot, saying so.
- `forward_many` runs every pass as one padded batch: row r holds pass r's tokens from
  t = 0, padding after them, each row at its own positions with its own causal mask.
  Padding rather than packing (all tokens in one row, a block-diagonal mask): a padded
  batch is what SDPA and a CUDA graph take as they are (static (rows, block) shapes); a
  packed layout needs a variable-length attention kernel to avoid a mask quadratic in
  the total. Verify blocks are short (k + 1 <= 33) and alike within a round, so padding
  wastes little; passes are grouped by block bucket, so a long prompt never pads the
  short blocks of the others to its length.
- Logits are computed only at the positions a pass asked for, and for `argmax_only`
  passes only the argmax ids leave the device.
- On CUDA (bfloat16 there) the layers of a pass replay a CUDA graph captured once per
  (rows, block, keys) bucket (cuda_graphs.py); the CPU runs the same forward eagerly.

Padding writes: a padding token of a real row writes its keys at position `context` of its
slot, which no valid query ever reads (valid positions are < context); padding rows of a
graph use the scratch slot.

A tree of guesses (`Pass.tree`) has siblings at one position, so its nodes' keys go to cells
of their own (after the history, in node order) apart from their rotary positions (by depth),
and a mask says who sees whom (the history and its ancestors); `keep_path` then copies the
kept nodes' cells after the history. A graph takes no mask: a forward holding a tree runs
eagerly.
"""

from __future__ import annotations

import heapq
import logging
import threading
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from remote_verify.backends.qwen2_static import StaticKV, StaticQwen2
from remote_verify.backends.target import CacheFull, Pass
from remote_verify.backends.torch_backend import TorchTarget

log = logging.getLogger(__name__)

BLOCK_BUCKETS = (1, 2, 3, 5, 9, 17, 33)  # k + 1 for k = 0, 1, 2, 4, 8, 16, 32; longer: powers of two
MIN_KEYS = 256  # keys read per row: a power of two from this, so few graph shapes cover all lengths
# What a GPU keeps free beside the weights and the KV slots: activations of a pass (a 320-token
# pass of the 32B holds tensors of tens of MB), the graphs' pool and cuBLAS's workspaces. An
# estimate with room, not a measurement.
GPU_HEADROOM_BYTES = 4 << 30


class NoFreeSlot(CacheFull):
    """Every KV slot is held by a session (the service refuses the new one: sessions_full)."""


class SlotCache:
    """One session's cache: a slot of the engine's static KV cache and its filled length."""

    def __init__(self, engine: StaticEngine, slot: int):
        self.engine = engine
        self.slot = slot
        self.length = 0
        # a cache dropped without release (a one-off forward, a test) still frees its slot
        self._finalizer = weakref.finalize(self, engine.pool.give, slot)

    def free(self) -> None:
        self._finalizer()  # at most once

    @property
    def live(self) -> bool:
        return self._finalizer.alive


class SlotPool:
    """Free slot ids, lowest first (sessions then share the low slots)."""

    def __init__(self, slots: int):
        self.size = slots
        self._free = list(range(slots))
        self._lock = threading.Lock()  # a cache collected on another thread gives its slot back there

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise NoFreeSlot(f"all {self.size} KV slots of the static torch cache are in use: close a "
                                 f"session, or start the service with more (--max-sessions sizes the cache)")
            return heapq.heappop(self._free)

    def give(self, slot: int) -> None:
        with self._lock:
            heapq.heappush(self._free, slot)

    @property
    def free(self) -> int:
        return len(self._free)


def slots_that_fit(wanted: int, slot_bytes: int, free_bytes: int, headroom_bytes: int = GPU_HEADROOM_BYTES) -> int:
    """How many of `wanted` KV slots of `slot_bytes` each fit in `free_bytes`, leaving the headroom."""
    return max(0, min(wanted, (free_bytes - headroom_bytes) // slot_bytes))


def block_bucket(n: int) -> int:
    for size in BLOCK_BUCKETS:
        if n <= size:
            return size
    return 1 << (n - 1).bit_length()


def row_bucket(n: int) -> int:
    return 1 << (n - 1).bit_length()


def keys_bucket(n: int, limit: int) -> int:
    return min(max(MIN_KEYS, 1 << (n - 1).bit_length()), limit)


class StaticEngine:
    """Slots, the static forward and (on CUDA) its graphs, around a Hugging Face Qwen2 model."""

    def __init__(self, hf_model, slots: int, context: int, cuda_graphs: bool = True):
        if slots < 1 or context < 2:
            raise ValueError(f"the static cache needs at least 1 slot and 2 positions, got {slots} and {context}")
        self.model = StaticQwen2(hf_model)
        self.device = self.model.device
        if self.device.type == "cuda":  # allocated whole at start: as many slots as the GPU holds
            slots = self._slots_on_gpu(slots, context)
        self.context = context  # valid positions 0..context-1; position `context` takes padding
        self.kv = StaticKV(self.model.shape, slots, context + 1, self.model.dtype, self.device)
        self.rope = self.model.rope_table(context + 1)
        self.pool = SlotPool(slots)
        self.graphs = None
        if cuda_graphs and self.device.type == "cuda":
            from remote_verify.backends.cuda_graphs import GraphedForward

            self.graphs = GraphedForward(self.model, self.kv, self.rope)
        log.info("static KV cache: %d slots of %d positions (%s), CUDA graphs %s", slots, context,
                 self.model.dtype, "on" if self.graphs else "off")

    def _slots_on_gpu(self, wanted: int, context: int) -> int:
        per_slot = StaticKV.slot_bytes(self.model.shape, context + 1, self.model.dtype)
        free, _ = torch.cuda.mem_get_info(self.device)
        fit = slots_that_fit(wanted + 1, per_slot, free) - 1  # one more slot: the scratch
        if fit < 1:
            raise RuntimeError(f"the GPU has {free / 2**30:.1f} GiB free beside the weights: not enough for one "
                               f"session's KV cache of {context} positions ({per_slot / 2**30:.2f} GiB) and "
                               f"{GPU_HEADROOM_BYTES >> 30} GiB of working memory; serve with a smaller --max-context")
        if fit < wanted:
            log.warning("the GPU's free memory holds the KV caches of %d sessions of %d positions, not %d: more "
                        "are refused (sessions_full) until one closes; a smaller --max-context fits more", fit,
                        context, wanted)
        return fit

    def new_cache(self) -> SlotCache:
        return SlotCache(self, self.pool.take())

    def release(self, cache: SlotCache) -> None:
        cache.free()

    def truncate(self, cache: SlotCache, length: int) -> None:
        cache.length = min(cache.length, max(length, 0))

    @torch.inference_mode()
    def keep_path(self, cache: SlotCache, length: int, nodes: Sequence[int]) -> None:
        """Move the kept tree nodes' keys and values (cells length + node) to the cells after the
        history, in path order (their rotary positions are those cells already), and cut the rest."""
        if list(nodes) != list(range(len(nodes))):  # a path of first nodes is in place already
            source = torch.tensor([length + node for node in nodes], dtype=torch.long, device=self.device)
            for cache_tensor in self.kv.keys + self.kv.values:
                cache_tensor[cache.slot, length:length + len(nodes)] = cache_tensor[cache.slot, source]  # gathered first
        cache.length = min(cache.length, length + len(nodes))

    @torch.inference_mode()
    def forward_many(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        """Every pass in as few forwards as there are block buckets among them (one, in a round)."""
        for item in passes:
            self._check(item)
        if len({id(item.cache) for item in passes}) != len(passes):
            raise ValueError("two passes of one forward share a cache: a session has one pass per forward")
        results: list[np.ndarray | None] = [None] * len(passes)
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(passes):
            groups.setdefault(block_bucket(len(item.tokens)), []).append(i)
        for bucket in sorted(groups):
            chosen = [passes[i] for i in groups[bucket]]
            for i, result in zip(groups[bucket], self._run(chosen, bucket)):
                results[i] = result
        return results

    def _check(self, item: Pass) -> None:
        cache = item.cache
        if not isinstance(cache, SlotCache) or cache.engine is not self or not cache.live:
            raise ValueError("a pass's cache must be a live slot of this target (from new_cache, not released)")
        n = len(item.tokens)
        if n == 0 or not 1 <= item.n_logits <= n:
            raise ValueError(f"a pass needs tokens and 1 <= n_logits <= their number; got {n} tokens, "
                             f"n_logits {item.n_logits}")
        if cache.length + n > self.context:
            raise ValueError(f"{cache.length} cached + {n} new tokens exceed the static cache's "
                             f"{self.context} positions (serve with a larger --max-context)")

    def _run(self, passes: list[Pass], bucket: int) -> list[np.ndarray]:
        trees = any(item.tree is not None for item in passes)  # a graph takes no mask: trees run eagerly
        graphed = self.graphs is not None and bucket <= BLOCK_BUCKETS[-1] and not trees
        rows = row_bucket(len(passes)) if graphed else len(passes)
        width = bucket if graphed else max(len(item.tokens) for item in passes)
        tokens = np.zeros((rows, width), dtype=np.int64)
        positions = np.full((rows, width), self.context, dtype=np.int64)  # padding's position
        slots = np.full(rows, self.kv.scratch_slot, dtype=np.int64)
        wanted = []  # flat (row * width + t) of every logit row asked for, pass by pass
        for r, item in enumerate(passes):
            n, start = len(item.tokens), item.cache.length
            tokens[r, :n] = item.tokens
            positions[r, :n] = np.arange(start, start + n)
            slots[r] = item.cache.slot
            wanted.extend(range(r * width + n - item.n_logits, r * width + n))
        cells = positions.copy()  # where each token's keys go: its position, but for a tree's nodes
        for r, item in enumerate(passes):
            if item.tree is not None:
                positions[r] = tree_positions(positions[r], len(item.tokens), item.tree)
        keys_read = keys_bucket(int(cells[cells < self.context].max()) + 1, self.context + 1)
        for slot in set(slots.tolist()):
            self.kv.make_readable(slot, keys_read)

        def as_tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array).to(self.device)

        if graphed:
            hidden = self.graphs.run(as_tensor(tokens), as_tensor(positions), as_tensor(slots), keys_read)
        elif trees:
            mask = np.arange(keys_read)[None, None, :] <= cells[:, :, None]  # (R, W, L): causal by cell
            for r, item in enumerate(passes):
                if item.tree is not None:
                    tree_rows(mask[r], item.cache.length, len(item.tokens), item.tree)
            hidden = self.model.hidden(self.kv, self.rope, as_tensor(tokens), as_tensor(slots),
                                       as_tensor(positions), keys_read, as_tensor(cells), as_tensor(mask))
        else:
            hidden = self.model.hidden(self.kv, self.rope, as_tensor(tokens), as_tensor(slots),
                                       as_tensor(positions), keys_read)
        chosen = hidden.reshape(rows * width, -1)[as_tensor(np.array(wanted))]  # (N, D)
        logits = self.model.logits(chosen)  # (N, V)
        ids = logits.argmax(dim=-1).cpu().numpy()  # (N,): a few integers cross to the host
        full = [i for i, item in enumerate(passes) if not item.argmax_only]
        host_logits = None
        if full:  # the rows of the passes that want logits, in one copy
            starts = np.cumsum([0] + [item.n_logits for item in passes])
            rows_wanted = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in full])
            host_logits = logits[as_tensor(rows_wanted)].float().cpu().numpy()
        results, offset, full_offset = [], 0, 0
        for item in passes:
            item.cache.length += len(item.tokens)
            if item.argmax_only:
                results.append(ids[offset:offset + item.n_logits])
            else:
                results.append(host_logits[full_offset:full_offset + item.n_logits])  # (n_logits, V)
                full_offset += item.n_logits
            offset += item.n_logits
        return results


def tree_positions(positions: np.ndarray, n: int, parents: Sequence[int]) -> np.ndarray:
    """A row's positions (W,) with its last len(parents) real tokens a tree: each node at the position
    after its parent's (a child of -1: after the token before the tree)."""
    positions = positions.copy()
    head = n - len(parents)
    for i, parent in enumerate(parents):
        positions[head + i] = positions[head + parent if parent >= 0 else head - 1] + 1
    return positions


def tree_rows(mask: np.ndarray, start: int, n: int, parents: Sequence[int]) -> None:
    """Make a row's causal mask (W, L) a tree's: node i sees the cells before the tree, its
    ancestors' and its own (the tree's cells are start + head ... in node order)."""
    head = n - len(parents)
    first = start + head  # the cell of node 0
    for i, parent in enumerate(parents):
        row = mask[head + i]
        row[first:first + len(parents)] = False
        if parent >= 0:
            row[first:first + parent + 1] = mask[head + parent, first:first + parent + 1]
        row[first + i] = True


class TorchStaticTarget(TorchTarget):
    """TorchTarget on the static path: same model and vocabulary, served by a StaticEngine."""

    def __init__(self, path: str | Path, device: str = "auto", dtype: torch.dtype | None = None,
                 slots: int = 32, context: int = 4096, cuda_graphs: bool = True):
        super().__init__(path, device=device, dtype=dtype, batch_invariant=False)
        self.engine = StaticEngine(self.model, slots=slots, context=min(context, self.max_context),
                                   cuda_graphs=cuda_graphs)
        self.max_context = self.engine.context
        self.name = f"torch-static:{self.device.type}"
        self.tree_attention = True

    def new_cache(self) -> SlotCache:
        return self.engine.new_cache()

    def release(self, cache: SlotCache) -> None:
        self.engine.release(cache)

    def truncate(self, cache: SlotCache, length: int) -> None:
        self.engine.truncate(cache, length)

    def keep_path(self, cache: SlotCache, length: int, nodes: Sequence[int]) -> None:
        self.engine.keep_path(cache, length, nodes)

    def forward(self, cache: SlotCache, tokens: Sequence[int], n_logits: int,
                tree: Sequence[int] | None = None) -> np.ndarray:
        return self.engine.forward_many([Pass(cache, list(tokens), n_logits, tree=tree)])[0]  # (n_logits, V)

    def forward_many(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        return self.engine.forward_many(passes)
