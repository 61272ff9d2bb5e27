"""The ways to generate a reply that `specwire bench` puts side by side, and one run's record."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    # "server" (the target streams alone), "stream" (the default: the service streams, the drafter
    # guesses ahead), "hybrid" (the round-based loop), "offline" or "reference"
    kind: str
    k: int | None = None  # hybrid: draft tokens per round; stream: guesses ahead; None: adaptive
    pipeline: bool = False  # hybrid: draft the next block while a verdict is in flight
    drafting: str = "model"  # "model", "ngram" (no model) or "mixed" (local_draft/draft_source.py)

    @property
    def uses_network(self) -> bool:
        return self.kind in ("server", "stream", "hybrid")


MODES = [
    Mode("server", "the service generates alone and streams tokens", "server"),
    Mode("default", "the service streams, the drafter guesses ahead while that pays (generate's and chat's "
         "default)", "stream"),
    Mode("stream-k4", "the service streams, the drafter always keeps up to 4 guesses ahead", "stream", k=4),
    Mode("stream-ngram", "the service streams, guesses copied from the context (n-gram), no draft model", "stream",
         drafting="ngram"),
    Mode("stream-mixed", "the service streams, guesses from the n-gram copy or the model, whichever is right "
         "more often", "stream", drafting="mixed"),
    Mode("k0", "one token per round trip, nothing drafted", "hybrid", k=0),
    Mode("k2", "hybrid, 2 draft tokens per round", "hybrid", k=2),
    Mode("k4", "hybrid, 4 draft tokens per round", "hybrid", k=4),
    Mode("k8", "hybrid, 8 draft tokens per round", "hybrid", k=8),
    Mode("auto", "hybrid, k chosen each round", "hybrid", k=None),
    Mode("auto+ahead", "hybrid rounds, k chosen each round, next block drafted during the round trip (the "
         "default before streaming)", "hybrid", k=None, pipeline=True),
    Mode("ngram", "hybrid, drafts copied from the context (n-gram), no draft model; k chosen each round",
         "hybrid", k=None, drafting="ngram"),
    Mode("mixed", "auto+ahead, each round's draft from the n-gram copy or the model, by measured benefit",
         "hybrid", k=None, pipeline=True, drafting="mixed"),
    Mode("offline", "the draft model alone, unverified", "offline"),
    Mode("hf-assisted", "Hugging Face assisted generation, same pair, in torch (outside reference)", "reference"),
]
MODES_BY_NAME = {mode.name: mode for mode in MODES}
FIXED_K = ("k0", "k2", "k4", "k8")  # what adaptive k is held against
DEFAULT_MODES = ("server", "k0", "auto+ahead", "default")  # the baseline, one round trip a token, rounds, streaming


@dataclass
class Run:
    """One generation of one prompt in one mode at one round-trip time."""

    mode: str
    rtt_ms: float
    prompt_kind: str
    prompt_index: int
    tokens: int
    wall_s: float
    first_token_s: float
    target_passes: int  # forward passes of the target model
    service_s: float  # the service's busy time (queue, forward, acceptance)
    round_trips: int
    bytes: int  # payload bytes both ways
    offline_tokens: int = 0  # made unverified because the service was lost (should stay 0)
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    by_source: dict[str, dict] = field(default_factory=dict)  # drafter -> rounds, drafted, accepted

    @classmethod
    def from_stats(cls, mode: str, rtt_ms: float, prompt_kind: str, prompt_index: int, token_ids: list[int],
                   stats) -> Run:
        """From a GenerationStats of the speculation loop or of server-only generation."""
        return cls(mode=mode, rtt_ms=rtt_ms, prompt_kind=prompt_kind, prompt_index=prompt_index,
                   tokens=len(token_ids), wall_s=stats.wall_s, first_token_s=stats.first_token_s or stats.wall_s,
                   target_passes=stats.verified_rounds, service_s=stats.service_s,
                   round_trips=stats.round_trips, bytes=stats.bytes_sent + stats.bytes_received,
                   offline_tokens=stats.offline if mode != "offline" else 0,
                   accepted_per_position=list(stats.accepted_per_position),
                   drafted_per_position=list(stats.drafted_per_position), token_ids=list(token_ids),
                   by_source={source: counts.as_dict() for source, counts in getattr(stats, "by_source", {}).items()})
