"""The display of a streaming reply: its turn in the transcript, its rounds drawn at a steady rate.

A reply is generated on the engine's worker ("engine", the group every blocking engine
call runs in), which commits rounds hundreds a second with a fast drafter; the screen
hands each one here (`committed`) and `show_tokens`, on a timer, puts every round queued
since on screen in one update, with the figures of the status line. Esc asks the reply to
stop (`stop`): it ends within a round, and its end is drawn after its last rounds.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from textual.containers import VerticalScroll

from app.chat.engine import ChatEngine
from app.chat.messages import ReplyFinished, ReplyStarted, TokensCommitted
from app.chat.settings import ChatSettings
from app.chat.state import LiveStats
from app.chat.widgets.assistant_turn import AssistantTurn
from app.chat.widgets.turns import UserTurn

log = logging.getLogger(__name__)

STREAM_FPS = 20  # screen updates a second while a reply streams


class StreamHost(Protocol):
    """What the display needs of the chat screen."""

    engine: ChatEngine
    settings: ChatSettings
    marks: bool
    stats: LiveStats  # the status line's figures
    context_used: int  # the tokens the conversation takes of the context

    def query_one(self, selector, expect_type=None): ...
    def run_worker(self, work, **options): ...
    def post_message(self, message) -> bool: ...
    def set_replying(self, replying: bool) -> None: ...
    def follow_transcript(self) -> None: ...
    def show_status(self) -> None: ...
    def add_notice(self, text: str, kind: str = "info") -> None: ...


class ReplyStream:
    def __init__(self, screen: StreamHost):
        self.screen = screen
        self.current: AssistantTurn | None = None  # the reply streaming now
        self.prompt_tokens = 0  # of the reply in progress, or the last one: for the context meter
        self._unshown: list[TokensCommitted] = []  # rounds committed but not drawn yet
        self.stop_requested = threading.Event()
        self.stopping = False  # esc was pressed: the reply ends within a round (its end clears it)

    @property
    def waiting(self) -> bool:
        """A reply is on screen with no token yet."""
        return self.current is not None and self.current.waiting

    async def start(self, text: str) -> None:
        """Show the message and an empty reply, and generate it on the engine's worker."""
        await self.open(text)
        self.screen.set_replying(True)
        self.screen.run_worker(lambda: self._generate(text), thread=True, exclusive=True, group="engine",
                               exit_on_error=False)

    def _generate(self, text: str) -> None:
        """On the engine's worker: the whole reply; its end is posted to the screen."""
        self.stop_requested.clear()
        screen = self.screen
        try:
            outcome = screen.engine.reply(text, self.stop_requested.is_set)
        except ValueError as exc:
            screen.post_message(ReplyFinished(None, str(exc)))
        except Exception as exc:  # the engine saved what it could; the app goes on
            log.exception("the reply failed")
            screen.post_message(ReplyFinished(None, f"the reply failed: {exc!r} (details in the log file)"))
        else:
            screen.post_message(ReplyFinished(outcome))

    def stop(self) -> None:
        """Esc: the reply ends after the round under way."""
        self.stop_requested.set()
        self.stopping = True

    async def open(self, text: str) -> None:
        """Show the message and an empty reply under it, and follow them."""
        screen = self.screen
        transcript = screen.query_one("#transcript", VerticalScroll)
        self.current = AssistantTurn(screen.engine.conversation.next_turn, screen.marks,
                                     screen.settings.steady_display)
        await transcript.mount_all([UserTurn(text), self.current])
        screen.follow_transcript()
        screen.stats = LiveStats(screen.engine.mode, screen.engine.k, 0)  # the last reply's figures are not this one's

    def reading(self, message: ReplyStarted) -> None:
        """The prompt is made: the reply says what the models read until its first token."""
        if self.current is not None and self.current.turn == message.turn:
            self.current.reading(message.prompt_tokens, message.unread_tokens)
        self.prompt_tokens = self.screen.context_used = message.prompt_tokens
        self.screen.show_status()

    def committed(self, message: TokensCommitted) -> None:
        self._unshown.append(message)  # shown by show_tokens, at most STREAM_FPS times a second

    async def show_tokens(self) -> None:
        """Put the rounds committed since the last call on screen, in one update."""
        if not self._unshown:
            return
        rounds, self._unshown = self._unshown, []
        if self.current is not None:
            mine = [r for r in rounds if r.turn == self.current.turn]
            await self.current.add([p for r in mine for p in r.pieces], [p for r in mine for p in r.provenance])
        self.screen.stats = rounds[-1].stats
        self.screen.context_used = self.prompt_tokens + (len(self.current.reply.provenance) if self.current else 0)
        self.screen.show_status()

    async def finish(self, message: ReplyFinished) -> None:
        """The reply ended: its last rounds, then its summary line (or the error that ended it)."""
        await self.show_tokens()
        if self.current is not None:
            outcome = message.outcome
            await self.current.finish(outcome.stop_reason if outcome else "error", outcome.stats if outcome else {})
        if message.error:
            self.screen.add_notice(message.error, "error")
        self.current = None
        self.stopping = False
