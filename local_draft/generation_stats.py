"""What a generation did and where its time went: data returned to the caller, not logs.

A verified round costs draft + round trip; the round trip splits into the service's own
time (queue, forward pass, acceptance: the Verdict reports them) and the wire (the rest).
Drafting ahead while a verdict is in flight is counted apart (`ahead_s`): it overlaps the
round trip, so it is not on the user's clock unless it outlasts it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class SourceCounts:
    """One drafter's rounds: how many drafted, the tokens drafted and how many the target accepted."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": round(self.acceptance_rate, 4)}


@dataclass
class GenerationStats:
    rounds: int = 0  # verified rounds plus offline steps
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # rounds accepting position i
    drafted_per_position: list[int] = field(default_factory=list)  # rounds drafting position i
    draft_s: float = 0.0  # drafting on the critical path
    verify_s: float = 0.0  # round trips, service time included
    wall_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    offline: int = 0  # tokens committed unverified while the service was away
    service_s: float = 0.0  # the service's own time in verify_s (queue, forward, acceptance)
    queue_s: float = 0.0  # of service_s: waiting for the device behind other sessions' work
    forward_s: float = 0.0  # of service_s: the target's forward passes
    ahead_drafted: int = 0  # tokens drafted ahead while a verdict was in flight
    forced_guesses: int = 0  # of those, tokens a grammar forces (guessed without the drafter)
    ahead_used: int = 0  # of those, tokens that went into a later round (the guess was right)
    ahead_s: float = 0.0  # time spent drafting ahead (overlapping round trips)
    syncs: int = 0  # extra round trips that rebuilt the service's copy of the history
    round_trips: int = 0  # requests answered by the service (rounds, syncs, a streamed generation)
    first_token_s: float | None = None  # time to the first committed token
    last_k: int = 0  # draft length of the latest round
    last_round_trip_s: float = 0.0  # the latest round's round trip minus the service's time
    last_source: str = ""  # who drafted the latest round that drafted: "model" or "ngram"
    by_source: dict[str, SourceCounts] = field(default_factory=dict)  # drafting rounds by drafter
    started_at: float = field(default_factory=time.perf_counter)

    @property
    def verified_rounds(self) -> int:
        """Rounds the target ran: one forward pass each."""
        return self.rounds - self.offline

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
        if self.first_token_s is None and committed:
            self.first_token_s = time.perf_counter() - self.started_at
        for counts, n in ((self.drafted_per_position, drafted), (self.accepted_per_position, accepted)):
            counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    def record_source(self, source: str, drafted: int, accepted: int) -> None:
        """Count a round that drafted under its drafter (\"model\" or \"ngram\")."""
        if drafted:
            counts = self.by_source.setdefault(source, SourceCounts())
            counts.rounds += 1
            counts.drafted += drafted
            counts.accepted += accepted
            self.last_source = source

    def as_dict(self) -> dict:
        seconds = {name: round(getattr(self, name), 4) for name in (
            "draft_s", "verify_s", "service_s", "queue_s", "forward_s", "wire_s", "ahead_s", "wall_s")}
        return {
            "rounds": self.rounds, "verified_rounds": self.verified_rounds, "drafted": self.drafted,
            "accepted": self.accepted, "generated": self.generated,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_round": round(self.tokens_per_round, 4),
            "accepted_per_position": self.accepted_per_position,
            "drafted_per_position": self.drafted_per_position,
            **seconds, "tokens_per_s": round(self.tokens_per_s, 2),
            "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 4),
            "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
            "offline": self.offline, "syncs": self.syncs, "round_trips": self.round_trips,
            "ahead_drafted": self.ahead_drafted, "ahead_used": self.ahead_used,
            "forced_guesses": self.forced_guesses,
            "by_source": {source: counts.as_dict() for source, counts in sorted(self.by_source.items())},
        }


@dataclass
class Generation:
    token_ids: list[int]
    stop_reason: str  # "eos", "max_tokens", "context" or "stopped"
    stats: GenerationStats
