"""What the engine's threads tell the chat screen: Textual messages, as dataclasses.

The engine never touches a widget; `ScreenListener` turns each of its calls into one of
these messages, posted to the screen (post_message is safe from any thread), and the
screen changes the widgets on its own event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.message_pump import MessagePump

from app.chat.state import Connection, LiveStats, ReplyOutcome, StartupProblem


@dataclass
class Progress(Message):
    text: str
    from_service: bool = False  # a line the starting service logged


@dataclass
class EngineReady(Message):
    """The drafter is loaded and the service reached (or offline was chosen)."""


@dataclass
class StartupFailed(Message):
    problem: StartupProblem


@dataclass
class ReplyStarted(Message):
    """The prompt is made: the models read its unread tokens before the first token comes."""

    turn: int
    prompt_tokens: int
    unread_tokens: int


@dataclass
class TokensCommitted(Message):
    turn: int
    provenance: list[str]
    pieces: list[str]
    stats: LiveStats


@dataclass
class ConnectionChanged(Message):
    connection: Connection


@dataclass
class NoteAdded(Message):
    turn: int | None  # None: about the chat, not about one reply
    text: str


@dataclass
class ReplyFinished(Message):
    outcome: ReplyOutcome | None  # None when the reply never started (the error says why)
    error: str | None = None


@dataclass
class CommandDone(Message):
    """A slow command (online, offline, new temperature) finished; `error` if it failed."""

    text: str
    error: bool = False


class ScreenListener:
    """The engine's listener: each call becomes a message to `target`."""

    def __init__(self, target: MessagePump):
        self.target = target

    def progress(self, text: str, from_service: bool = False) -> None:
        self.target.post_message(Progress(text, from_service))

    def reading(self, turn: int, prompt_tokens: int, unread_tokens: int) -> None:
        self.target.post_message(ReplyStarted(turn, prompt_tokens, unread_tokens))

    def committed(self, turn: int, provenance: list[str], pieces: list[str], stats: LiveStats) -> None:
        self.target.post_message(TokensCommitted(turn, provenance, pieces, stats))

    def connection_changed(self, connection: Connection) -> None:
        self.target.post_message(ConnectionChanged(connection))

    def note(self, turn: int | None, text: str) -> None:
        self.target.post_message(NoteAdded(turn, text))
