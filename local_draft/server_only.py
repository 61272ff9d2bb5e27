"""Server-only generation: the target alone makes every token and streams it back.

No draft model runs: this is the baseline a user would otherwise pick (one request, a
stream of tokens, one target forward pass per token), and the way for a client that
cannot run a drafter. Tokens are reported with provenance "target". The client keeps the
history, as in the speculation loop, so the service's copy is rebuilt by Sync when needed,
and a stream cut short by a lost or draining service goes on from where it stopped once
the link has a connection again (any replica will do). With a grammar the target alone is
constrained by it (`--mode server` with the same schema: the baseline of constrained speculation).
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

from local_draft.generation_stats import Generation, GenerationStats
from local_draft.history_rewind import opening
from local_draft.service_link import ServiceLink
from local_draft.speculator import FixedLink, OnCommit, ShouldStop
from local_draft.verify_client import ServiceUnreachable, VerifyClient, VerifyError
from local_draft.stream_speculator import GrammarUnsupported
from wire.protocol import Cancel, Generate, Generated, Grammar, Sync

STOP_REASONS = {"cancelled": "stopped"}  # the service's word -> the speculation loop's
INTERRUPTED = ("going_away", "lost")  # the stream ended before its end: continue elsewhere


class ServerOnlyGenerator:
    def __init__(self, link: ServiceLink | VerifyClient, end_ids: Iterable[int], resume_within_s: float = 30.0,
                 grammar: Grammar | None = None):
        self.grammar = grammar  # constrains each generation's tokens (from the generation's start)
        self._grammar_at: Grammar | None = None  # the running generation's, with its start
        self.link = FixedLink(link) if isinstance(link, VerifyClient) else link
        self.end_ids = sorted(end_ids)  # the stream stops after any of these (EOS and its kin)
        self.resume_within_s = resume_within_s  # how long to wait for a lost service to come back
        self.stats = GenerationStats()  # the generation in progress (or the last one), live
        self._client: VerifyClient | None = None  # the connection _service_history refers to
        self._service_history: list[int] = []  # what the service holds, as far as we know
        self._seq = 0
        self._seed: int | None = None  # set by reseed: the service's key to send in a Sync
        self._keyed: VerifyClient | None = None  # the connection that has been sent self._seed

    def reseed(self, seed: int) -> None:
        """Key the service's draws by `seed` from the next generation on, as a new session with
        that seed would: for many independent seeded generations on one connection."""
        self._seed, self._keyed = seed, None

    def generate(self, context: Sequence[int], max_tokens: int, on_commit: OnCommit | None = None,
                 should_stop: ShouldStop | None = None) -> Generation:
        """Continue `context` by up to max_tokens tokens, all made by the target."""
        stats = self.stats = GenerationStats()
        new: list[int] = []
        self._grammar_at = None if self.grammar is None else Grammar(self.grammar.kind, self.grammar.schema,
                                                                     start=len(context))
        while True:
            client = self._current_client()
            sent0, received0 = client.bytes_sent, client.bytes_received
            try:
                reason = self._stream(client, list(context) + new, max_tokens - len(new), new, on_commit,
                                      should_stop)
            except ServiceUnreachable as exc:
                self._forget_client()
                self.link.lost(str(exc))  # a bare client (FixedLink) raises here
                reason = "lost"
            stats.bytes_sent += client.bytes_sent - sent0
            stats.bytes_received += client.bytes_received - received0
            if reason not in INTERRUPTED or len(new) >= max_tokens:
                break
        stats.wall_s = time.perf_counter() - stats.started_at
        stats.verify_s = stats.wall_s  # the whole generation is spent waiting on the service
        return Generation(new, STOP_REASONS.get(reason, reason), stats)

    def _stream(self, client: VerifyClient, history: list[int], max_tokens: int, new: list[int],
                on_commit: OnCommit | None, should_stop: ShouldStop | None) -> str:
        """One Generate and its stream of frames; returns the service's stop reason."""
        stats = self.stats
        frame = self._start(client, history, max_tokens)
        cancelled = False
        while True:
            stats.service_s += frame.forward_s + frame.queue_s
            stats.forward_s += frame.forward_s
            stats.queue_s += frame.queue_s
            if frame.tokens:
                new += frame.tokens
                history += frame.tokens
                stats.record_round(0, 0, len(frame.tokens))  # one forward pass per token
                if on_commit:
                    on_commit(list(frame.tokens), ["target"] * len(frame.tokens))
            if frame.done:
                self._service_history = history
                return frame.stop_reason
            if not cancelled and should_stop is not None and should_stop():
                client.send_cancel(Cancel(seq=self._seq))
                cancelled = True
            frame = client.receive_generated()

    def _start(self, client: VerifyClient, history: list[int], max_tokens: int) -> Generated:
        """Send Generate (after a Sync if the service's copy may differ); returns the first frame."""
        if self._grammar_at is not None and self._grammar_at.kind not in client.welcome.grammars:
            raise GrammarUnsupported(f"the verification service cannot apply a {self._grammar_at.kind} grammar: "
                                     "it runs an older specwire, or one without llguidance")
        for attempt in range(2):
            if attempt:  # the service lost track of us once: rebuild its copy
                self._sync(client, history)
            rekey = self._seed is not None and self._keyed is not client
            known, keep = opening(client, self._service_history, history, rekey, lambda: self._sync(client, history))
            self._keyed = client
            self._seq += 1
            self._service_history = []  # unknown until the stream ends
            start = known if keep == -1 else keep
            client.send_generate(Generate(seq=self._seq, committed_len=known, append=history[start:],
                                          max_tokens=max_tokens, stop_ids=self.end_ids, grammar=self._grammar_at,
                                          keep=keep, seed=self._seed if rekey else None))
            self.stats.round_trips += 1
            try:
                return client.receive_generated(first=True)
            except VerifyError as exc:
                if attempt or exc.fatal or exc.code not in ("stale_state", "bad_seq"):
                    raise  # the service lost track of us once: rebuild its copy and retry

    def _sync(self, client: VerifyClient, history: list[int]) -> None:
        self._seq += 1
        client.sync(Sync(seq=self._seq, tokens=list(history), seed=self._seed))
        self._keyed = client
        self._service_history = list(history)
        self.stats.syncs += 1
        self.stats.round_trips += 1

    def _current_client(self) -> VerifyClient:
        """The link's live connection, waiting up to resume_within_s for one while it reconnects."""
        deadline = time.monotonic() + self.resume_within_s
        while (client := self.link.current()) is None:
            if time.monotonic() > deadline:
                raise ServiceUnreachable(f"the verification service did not come back within "
                                         f"{self.resume_within_s:g} s")
            time.sleep(0.05)
        if client is not self._client:  # a new connection is a new, empty session
            self._client, self._service_history, self._seq = client, [], 0
        return client

    def _forget_client(self) -> None:
        self._client, self._service_history, self._seq = None, [], 0
