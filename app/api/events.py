"""What a request's generation reports to the HTTP side, and the request made ready for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from app.api.errors import ApiError
from app.api.request_body import CompletionRequest


@dataclass(frozen=True)
class Job:
    """A checked request made ready: its prompt's tokens and how many it may add."""

    request: CompletionRequest
    prompt: list[int]
    max_tokens: int
    received_at: float = 0.0  # time.perf_counter() when its body had been read


@dataclass(frozen=True)
class Accepted:
    """The prompt fits: generation starts."""


@dataclass(frozen=True)
class Delta:
    text: str  # safe to send: no part of it can turn out to be part of a stop string
    # when asked: the entries of the tokens since the last Delta (app/api/logprobs.py)
    logprobs: list[dict] | None = None


@dataclass(frozen=True)
class Finished:
    text: str  # the whole reply, as sent
    finish_reason: str  # "stop" (an end token or a stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    provenance: dict = field(default_factory=dict)  # the response's `specwire` object
    tool_calls: list[dict] = field(default_factory=list)  # the calls read from the reply (OpenAI's shape)
    content: str | None = ""  # the message's content beside the calls (None: the reply was a call alone)
    logprobs: list[dict] | None = None  # when asked: every token's entry (a stream sent them with its deltas)


@dataclass(frozen=True)
class Failed:
    error: ApiError


Event = Accepted | Delta | Finished | Failed
Emit = Callable[[Event], None]
