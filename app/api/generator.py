"""How a request generates: the one function that chooses, so the default can change in one place.

The modes, as `specwire chat` generates:
- "hybrid": the default mode (local_draft/stream_speculator.py): the service streams, the
  drafter guesses ahead while that pays and the service keeps the right guesses; a service
  lost mid-reply is continued offline;
- "ngram": every drafter is busy with other requests, so the n-gram copy of the context
  guesses (no model, no cost here) and the service keeps the right guesses; a lost service is
  waited for a few seconds (then the request goes on with a drafter: app/api/generation.py);
- "offline": no service, the drafter alone; every token is marked unverified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from local_draft.draft_model import DraftModel
from local_draft.generation_stats import Generation, GenerationStats
from local_draft.service_link import ServiceLink
from local_draft.stream_speculator import StreamSpeculator
from wire.protocol import Grammar, SamplingParams

# With no draft model (n-gram), how long a request waits for a lost service to come back, before it
# waits for a drafter to go on offline (app/api/generation.py); the chat, which has no such way on, waits 30 s.
NO_MODEL_RESUME_S = 5.0
MODES = ("hybrid", "ngram", "offline")


@dataclass(frozen=True)
class HowToGenerate:
    """A request's settings for its generator."""

    params: SamplingParams
    seed: int | None  # None: a fresh one
    k: int | None  # guesses kept ahead of the stream; None: while drafting pays; 0: none
    drafting: str  # with a drafter: "model", or "mixed" (n-gram drafts where they pay)
    end_ids: frozenset[int]
    grammar: Grammar | None = None  # response_format's: every token of the reply is constrained by it
    logprobs: int = -1  # -1: none; n: the target's log probability of each token and its n most likely


class Generator(Protocol):
    stats: GenerationStats

    def generate(self, context: Sequence[int], max_tokens: int,
                 on_commit: Callable[[list[int], list[str]], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> Generation: ...


def build_generator(mode: str, drafter: DraftModel | None, link: ServiceLink | None, how: HowToGenerate) -> Generator:
    """The generator of one request (its own session: `link` is this request's alone)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "ngram":
        return StreamSpeculator(None, link, how.params, seed=how.seed, max_block=how.k, drafting="ngram",
                                end_ids=how.end_ids, resume_within_s=NO_MODEL_RESUME_S, grammar=how.grammar,
                                logprobs=how.logprobs)
    return StreamSpeculator(drafter, link if mode == "hybrid" else None, how.params, seed=how.seed,
                            max_block=how.k, drafting=how.drafting, end_ids=how.end_ids, grammar=how.grammar,
                            logprobs=how.logprobs)
