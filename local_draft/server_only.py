"""Server-only generation: the target alone makes every token and streams it back.

No draft model runs: this is the baseline a user would otherwise pick (one request, a
stream of tokens, one target forward pass per token), and the way for a client that
cannot run a drafter. Tokens are reported with provenance "target". The client keeps the
history, as in the speculation loop, so the service's copy is rebuilt by Sync when needed.
"""

from __future__ import annotations

import time
from typing import Sequence

from local_draft.generation_stats import Generation, GenerationStats
from local_draft.speculator import OnCommit, ShouldStop
from local_draft.verify_client import VerifyClient, VerifyError
from remote_verify.protocol import Cancel, Generate, Generated, Sync

STOP_REASONS = {"cancelled": "stopped"}  # the service's word -> the speculation loop's


class ServerOnlyGenerator:
    def __init__(self, client: VerifyClient, eos_id: int):
        self.client = client
        self.eos_id = eos_id
        self.stats = GenerationStats()  # the generation in progress (or the last one), live
        self._service_history: list[int] = []  # what the service holds, as far as we know
        self._seq = 0

    def generate(self, context: Sequence[int], max_tokens: int, on_commit: OnCommit | None = None,
                 should_stop: ShouldStop | None = None) -> Generation:
        """Continue `context` by up to max_tokens tokens, all made by the target."""
        history = list(context)
        stats = self.stats = GenerationStats()
        sent0, received0 = self.client.bytes_sent, self.client.bytes_received
        frame = self._start(history, max_tokens, stats)
        new: list[int] = []
        cancelled = False
        while True:
            stats.service_s += frame.forward_s + frame.queue_s
            stats.forward_s += frame.forward_s
            stats.queue_s += frame.queue_s
            if frame.tokens:
                new += frame.tokens
                stats.record_round(0, 0, len(frame.tokens))  # one forward pass per token
                if on_commit:
                    on_commit(list(frame.tokens), ["target"] * len(frame.tokens))
            if frame.done:
                stop_reason = STOP_REASONS.get(frame.stop_reason, frame.stop_reason)
                break
            if not cancelled and should_stop is not None and should_stop():
                self.client.send_cancel(Cancel(seq=self._seq))
                cancelled = True
            frame = self.client.receive_generated()
        self._service_history = history + new
        stats.wall_s = time.perf_counter() - stats.started_at
        stats.verify_s = stats.wall_s  # the whole generation is spent waiting on the service
        stats.bytes_sent = self.client.bytes_sent - sent0
        stats.bytes_received = self.client.bytes_received - received0
        return Generation(new, stop_reason, stats)

    def _start(self, history: list[int], max_tokens: int, stats: GenerationStats) -> Generated:
        """Send Generate (after a Sync if the service's copy may differ); returns the first frame."""
        for attempt in range(2):
            if attempt or self._service_history != history[: len(self._service_history)]:
                self._sync(history, stats)
            self._seq += 1
            known = len(self._service_history)
            self._service_history = []  # unknown until the stream ends
            self.client.send_generate(Generate(seq=self._seq, committed_len=known, append=history[known:],
                                               max_tokens=max_tokens, stop_ids=[self.eos_id]))
            stats.round_trips += 1
            try:
                return self.client.receive_generated()
            except VerifyError as exc:
                if attempt or exc.fatal or exc.code not in ("stale_state", "bad_seq"):
                    raise  # the service lost track of us once: rebuild its copy and retry

    def _sync(self, history: list[int], stats: GenerationStats) -> None:
        self._seq += 1
        self.client.sync(Sync(seq=self._seq, tokens=list(history)))
        self._service_history = list(history)
        stats.syncs += 1
        stats.round_trips += 1
