"""The chat's shared state types: what the engine reports and the screen and widgets show.

They live apart from the engine so that messages, widgets and dialogs can name them
without importing the engine (and through it the models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LiveStats:
    """The figures of the status line, copied out of the running generation."""

    mode: str  # "hybrid", "remote" or "offline"
    k: int | None  # the setting: None is auto
    last_k: int  # what the latest round drafted
    rounds: int = 0
    generated: int = 0
    offline: int = 0  # tokens (and rounds: one each) made while the service was away
    drafted: int = 0
    acceptance_rate: float = 0.0
    tokens_per_round: float = 0.0
    tokens_per_s: float = 0.0
    round_trip_s: float = 0.0

    @property
    def verified_rounds(self) -> int:
        return self.rounds - self.offline


@dataclass(frozen=True)
class Connection:
    connected: bool
    detail: str  # for a person: where, or what went wrong
    retry_in_s: float | None = None


@dataclass(frozen=True)
class ReplyOutcome:
    turn: int
    stop_reason: str
    stats: dict


class EngineListener(Protocol):
    def progress(self, text: str, from_service: bool = False) -> None:
        """A startup step, or (from_service) a line the starting service logged."""

    def reading(self, turn: int, prompt_tokens: int, unread_tokens: int) -> None:
        """A reply starts: its prompt has prompt_tokens, unread_tokens of them new to the models."""

    def committed(self, turn: int, provenance: list[str], pieces: list[str], stats: LiveStats) -> None:
        """A round's tokens, as text pieces with their provenance."""

    def connection_changed(self, connection: Connection) -> None:
        """The link to the service went up or down."""

    def note(self, turn: int | None, text: str) -> None:
        """Something to tell the user: about a reply (turn) or about the chat (None)."""


class StartupProblem(Exception):
    """The chat cannot reach its service; `offline_possible` says whether the drafter alone can go on."""

    def __init__(self, kind: str, message: str, offline_possible: bool = True, retry_possible: bool = True):
        super().__init__(message)
        self.kind = kind  # "missing_model", "service_failed", "unreachable", "refused"
        self.offline_possible = offline_possible
        self.retry_possible = retry_possible


class BusyError(RuntimeError):
    """An operation that has to wait for the reply in progress."""
