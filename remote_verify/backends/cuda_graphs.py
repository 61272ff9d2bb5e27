"""CUDA graphs of the static Qwen2 forward, one per (rows, block, keys) bucket.

An eager forward of a 28-layer model launches several hundred kernels; at a verify block
of a few tokens the GPU finishes each before the CPU has launched the next, so a pass
costs launch time, not weight reads. A graph records the launches once and replays them
with one call. Shapes are static in a graph, so a pass is padded up to its bucket (rows
to a power of two, block length to 1, 2, 3, 5, 9, 17 or 33, keys read to a power of two
from 256) and each bucket is captured the first time it is used. The graph ends at the
final norm's hidden states (rows, block, D); the output head runs eagerly on the few
positions a pass wants, so no graph holds a (rows, block, vocabulary) buffer.

Captured graphs share one memory pool. That is safe here because a replay's outputs are
consumed (gathered and copied) before the next replay, and replays never overlap: one
device worker runs every forward.

Only `_record` needs CUDA. The CPU suite runs everything else here (bucket keys, static
input buffers, placeholder warm-up in the scratch slot, replays into padded shapes) with
`_record` replaced by a plain call of the forward; the capture itself runs only on a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from remote_verify.backends.qwen2_static import StaticKV, StaticQwen2

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # cuBLAS picks algorithms and allocates workspaces on first calls, outside the graph


@dataclass
class CapturedForward:
    tokens: torch.Tensor  # (R, T) int64, static input
    positions: torch.Tensor  # (R, T) int64, static input
    slots: torch.Tensor  # (R,) int64, static input
    hidden: torch.Tensor  # (R, T, D), static output
    replay: Callable[[], None]


class GraphedForward:
    def __init__(self, model: StaticQwen2, kv: StaticKV, rope: tuple[torch.Tensor, torch.Tensor]):
        self.model, self.kv, self.rope = model, kv, rope
        self.pool = None  # one memory pool for every graph, made at the first capture
        self.captured: dict[tuple[int, int, int], CapturedForward] = {}

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            keys_read: int) -> torch.Tensor:
        """The forward's hidden states (R, T, D) for inputs already padded to a bucket."""
        key = (tokens.shape[0], tokens.shape[1], keys_read)
        entry = self.captured.get(key) or self._capture(*key)
        entry.tokens.copy_(tokens)
        entry.positions.copy_(positions)
        entry.slots.copy_(slots)
        entry.replay()
        return entry.hidden

    def _capture(self, rows: int, width: int, keys_read: int) -> CapturedForward:
        device = self.model.device
        # Placeholder inputs: every row is padding in the scratch slot, so warm-up and
        # capture write nowhere a session reads.
        scratch, pad_position = self.kv.scratch_slot, self.kv.positions - 1
        self.kv.make_readable(scratch, keys_read)
        tokens = torch.zeros((rows, width), dtype=torch.int64, device=device)
        positions = torch.full((rows, width), pad_position, dtype=torch.int64, device=device)
        slots = torch.full((rows,), scratch, dtype=torch.int64, device=device)

        def forward() -> torch.Tensor:
            return self.model.hidden(self.kv, self.rope, tokens, slots, positions, keys_read)

        replay, hidden = self._record(forward)
        entry = CapturedForward(tokens, positions, slots, hidden, replay)
        self.captured[(rows, width, keys_read)] = entry
        log.info("captured a CUDA graph for %d rows x %d tokens, %d keys (%d graphs)", rows, width, keys_read,
                 len(self.captured))
        return entry

    def _record(self, forward: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Capture `forward` in a CUDA graph: (replay, the graph's output tensor)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = forward()
        return graph.replay, hidden
