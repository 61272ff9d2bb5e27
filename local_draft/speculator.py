"""The speculation loop: draft k tokens, have the service verify them, commit, repeat.

The client holds the whole history; the service holds a copy it extends each round. When
the two could differ (a reply cut at EOS, a new turn, an error) the client sends Sync.
Every committed token is reported with its provenance: "draft" (a draft token the target
accepted), "target" (the target's correction or bonus) or "offline" (unverified).

When the service is lost mid-reply the loop goes on offline, one draft token a round,
while the ServiceLink reconnects; the first round on a new connection rebuilds the
service's copy from the client's history, and verification resumes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from local_draft.draft_model import DraftModel, DraftModelError
from local_draft.service_link import ServiceLink
from local_draft.verify_client import ServiceUnreachable, VerifyClient, VerifyError
from remote_verify.protocol import SamplingParams, Sync, Verify

OnCommit = Callable[[list[int], list[str]], None]  # (tokens, provenance of each)
ShouldStop = Callable[[], bool]


class FixedLink:
    """A bare client as a link that never reconnects: losing its service is an error."""

    def __init__(self, client: VerifyClient):
        self.client = client

    def current(self) -> VerifyClient:
        return self.client

    def lost(self, reason: str) -> None:
        raise ServiceUnreachable(reason)


@dataclass
class GenerationStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # rounds accepting position i
    drafted_per_position: list[int] = field(default_factory=list)  # rounds drafting position i
    draft_s: float = 0.0
    verify_s: float = 0.0  # round trips, service time included
    wall_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    offline: int = 0  # tokens committed unverified while the service was away
    service_s: float = 0.0  # the service's own time in verify_s (queue, forward, acceptance)
    last_k: int = 0  # draft length of the latest round
    last_round_trip_s: float = 0.0  # the latest round's verify_s minus the service's time
    started_at: float = field(default_factory=time.perf_counter)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Over the whole generation once it ended; so far while it runs."""
        wall = self.wall_s or (time.perf_counter() - self.started_at)
        return self.generated / wall if wall > 0 else 0.0

    @property
    def wire_s(self) -> float:
        """Time on the network: round trips minus what the service spent on them."""
        return max(0.0, self.verify_s - self.service_s)

    def record_round(self, drafted: int, accepted: int, committed: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.generated += committed
        for counts, n in ((self.drafted_per_position, drafted), (self.accepted_per_position, accepted)):
            counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "generated": self.generated, "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_round": round(self.tokens_per_round, 4),
            "accepted_per_position": self.accepted_per_position,
            "drafted_per_position": self.drafted_per_position,
            "draft_s": round(self.draft_s, 4), "verify_s": round(self.verify_s, 4),
            "wall_s": round(self.wall_s, 4), "tokens_per_s": round(self.tokens_per_s, 2),
            "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
            "offline": self.offline, "service_s": round(self.service_s, 4), "wire_s": round(self.wire_s, 4),
        }


@dataclass
class Generation:
    token_ids: list[int]
    stop_reason: str  # "eos", "max_tokens", "context" or "stopped"
    stats: GenerationStats


class Speculator:
    def __init__(self, draft: DraftModel, link: ServiceLink | VerifyClient | None,
                 params: SamplingParams, k: int | None = 4, seed: int | None = None):
        self.draft = draft
        self.link = FixedLink(link) if isinstance(link, VerifyClient) else link  # None: offline
        self.params = params
        self.k = k  # draft tokens per round; None: chosen each round (adaptive)
        self.stats = GenerationStats()  # the generation in progress (or the last one), live
        self.rng = np.random.default_rng(seed)
        self._client: VerifyClient | None = None  # the connection _service_history refers to
        self._service_history: list[int] = []  # what the service holds, as far as we know
        self._seq = 0
        self._bytes_before_client = (0, 0)  # byte counts of connections since replaced

    def generate(self, context: Sequence[int], max_tokens: int, on_commit: OnCommit | None = None,
                 should_stop: ShouldStop | None = None) -> Generation:
        """Continue `context` by up to max_tokens tokens (fewer at EOS, a full context or a stop)."""
        history = list(context)
        new: list[int] = []
        stats = self.stats = GenerationStats()
        started = time.perf_counter()
        self._use_current_client()  # so that the byte counts start after any handshake
        sent0, received0 = self._byte_counts()
        stop_reason = "max_tokens"
        while len(new) < max_tokens:
            if should_stop is not None and should_stop():
                stop_reason = "stopped"
                break
            try:
                committed, provenance = self._round(history, max_tokens - len(new), stats)
            except DraftModelError:
                stop_reason = "context"
                break
            except VerifyError as exc:
                if exc.code != "context_full":
                    raise
                stop_reason = "context"  # the service's context limit is below the drafter's
                break
            if self.draft.eos_id in committed:
                cut = committed.index(self.draft.eos_id) + 1
                committed, provenance = committed[:cut], provenance[:cut]
                stop_reason = "eos"
            history += committed
            new += committed
            if on_commit:
                on_commit(committed, provenance)
            if stop_reason == "eos":
                break
        stats.wall_s = time.perf_counter() - started
        sent1, received1 = self._byte_counts()
        stats.bytes_sent, stats.bytes_received = sent1 - sent0, received1 - received0
        return Generation(new, stop_reason, stats)

    def _round(self, history: list[int], remaining: int,
               stats: GenerationStats) -> tuple[list[int], list[str]]:
        """One round; returns the committed tokens and the provenance of each."""
        if not self._use_current_client():
            return self._offline_round(history, stats)

        wanted = self.k if self.k is not None else 4
        k = max(0, min(wanted, remaining - 1))  # the service always adds one token of its own
        t0 = time.perf_counter()
        draft, dists = self.draft.propose(history, k, self.params, self.rng) if k else ([], [])
        if self.draft.eos_id in draft:  # nothing after an end of text is worth verifying
            cut = draft.index(self.draft.eos_id) + 1
            draft, dists = draft[:cut], dists[:cut]
        t1 = time.perf_counter()
        stats.draft_s += t1 - t0
        try:
            verdict = self._verify(history, draft, dists)
        except ServiceUnreachable as exc:
            self._forget_client()
            self.link.lost(str(exc))  # a FixedLink raises here: no link, no fallback
            # The drafts were sampled for the wire (truncated): draw afresh, as offline does.
            return self._offline_round(history, stats)
        round_trip = time.perf_counter() - t1
        stats.verify_s += round_trip
        service_time = verdict.forward_s + verdict.accept_s
        stats.service_s += service_time
        stats.last_k = k
        stats.last_round_trip_s = max(0.0, round_trip - service_time)
        committed = draft[: verdict.accepted] + [verdict.token]
        self._service_history = history + committed
        stats.record_round(len(draft), verdict.accepted, len(committed))
        return committed, ["draft"] * verdict.accepted + ["target"]

    def _offline_round(self, history: list[int], stats: GenerationStats) -> tuple[list[int], list[str]]:
        """The draft model alone, one token from its full distribution: unverified."""
        t0 = time.perf_counter()
        tokens, _ = self.draft.propose(history, 1, self.params, self.rng, cap=None)
        stats.draft_s += time.perf_counter() - t0
        stats.record_round(0, 0, 1)
        stats.offline += 1
        return tokens, ["offline"]

    def _use_current_client(self) -> bool:
        """Follow the link to its live connection; a new one starts with an empty session."""
        client = self.link.current() if self.link is not None else None
        if client is not self._client:
            self._forget_client()
            self._client = client
        return client is not None

    def _forget_client(self) -> None:
        if self._client is not None:
            sent, received = self._bytes_before_client
            self._bytes_before_client = (sent + self._client.bytes_sent, received + self._client.bytes_received)
        self._client = None
        self._service_history = []
        self._seq = 0

    def _verify(self, history: list[int], draft: list[int], dists):
        known = self._service_history
        if known != history[: len(known)]:
            self._sync(history)
            known = self._service_history
        self._seq += 1
        request = Verify(seq=self._seq, committed_len=len(known), append=history[len(known):],
                         draft=draft, draft_dists=dists)
        try:
            return self._client.verify(request)
        except VerifyError as exc:
            if exc.fatal or exc.code not in ("stale_state", "bad_seq"):
                raise
        self._sync(history)  # the service lost track of us: rebuild its copy, retry once
        self._seq += 1
        return self._client.verify(Verify(seq=self._seq, committed_len=len(history), draft=draft,
                                         draft_dists=dists))

    def _sync(self, history: list[int]) -> None:
        self._seq += 1
        self._client.sync(Sync(seq=self._seq, tokens=list(history)))
        self._service_history = list(history)

    def _byte_counts(self) -> tuple[int, int]:
        sent, received = self._bytes_before_client
        if self._client is not None:
            sent, received = sent + self._client.bytes_sent, received + self._client.bytes_received
        return sent, received
