"""The display of a streaming reply: its turn in the transcript, its rounds drawn at a steady rate.

A reply is generated on the engine's worker ("engine", the group every blocking engine
call runs in), which commits rounds hundreds a second with a fast drafter; the screen
hands each one here (`committed`) and `show_tokens`, on a timer, puts every round queued
since on screen in one update, with the figures of the status line.

A message sent while the engine cannot take it (the chat starts, or reconnects) is
shown at once all the same, waiting, and generated when the engine is free
(`run_pending`). Esc (`stop`) stops a reply in every state: a waiting message is taken
back into the prompt box; a reply under way ends within a round.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import Protocol

from textual.containers import VerticalScroll

from app.chat.engine import ChatEngine
from app.chat.messages import ReplyFinished, ReplyStarted, TokensCommitted
from app.chat.settings import ChatSettings
from app.chat.state import LiveStats
from app.chat.widgets.assistant_turn import AssistantTurn
from app.chat.widgets.prompt_input import PromptInput
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
    def query(self, selector): ...
    def run_worker(self, work, **options): ...
    def post_message(self, message) -> bool: ...
    def set_replying(self, replying: bool) -> None: ...
    def follow_transcript(self) -> None: ...
    def engine_waited_for(self) -> str | None: ...
    def show_status(self) -> None: ...
    def add_notice(self, text: str, kind: str = "info") -> None: ...


class ReplyStream:
    def __init__(self, screen: StreamHost):
        self.screen = screen
        self.current: AssistantTurn | None = None  # the reply streaming now
        self.prompt_tokens = 0  # of the reply in progress, or the last one: for the context meter
        self._unshown: list[TokensCommitted] = []  # rounds committed but not drawn yet
        self.pending: str | None = None  # a message shown, waiting for the engine to take it
        self.stop_requested = threading.Event()  # the reply under way's own (a new one each reply)
        self.stopping = False  # esc was pressed: the reply ends within a round (its end clears it)

    @property
    def waiting_for(self) -> str:
        """What the reply on screen waits for ("the first token"), or "" once its tokens come."""
        return self.current.waiting_for if self.current is not None and self.current.waiting else ""

    async def start(self, text: str) -> None:
        """Show the message and an empty reply; generate it on the engine's worker, at once if
        the engine is free, else when it is (`run_pending`)."""
        await self.open(text)
        self.screen.set_replying(True)
        waited_for = self.screen.engine_waited_for()
        if waited_for is None:
            self._run(text)
        else:
            self.pending = text
            self.current.wait_for(waited_for)
            self.screen.show_status()

    async def run_pending(self) -> None:
        """The engine is free: generate the message that waited for it (one that no longer fits
        the context goes back into the box, with the reason)."""
        text, self.pending = self.pending, None
        if text is None:
            return
        try:
            self.screen.engine.check_prompt(text)
        except ValueError as exc:
            await self._take_back(text, str(exc), "error")
            return
        self.current.wait_for("the first token")
        self._run(text)

    def _run(self, text: str) -> None:
        # A new stop flag for each reply, made here and never cleared: an esc pressed before the
        # worker's thread starts (a busy executor) is kept, and no earlier esc carries over.
        self.stop_requested = threading.Event()
        self.screen.run_worker(partial(self._generate, text, self.stop_requested), thread=True,
                               exclusive=True, group="engine", exit_on_error=False)

    def _generate(self, text: str, stop_requested: threading.Event) -> None:
        """On the engine's worker: the whole reply; its end is posted to the screen."""
        screen = self.screen
        try:
            outcome = screen.engine.reply(text, stop_requested.is_set)
        except ValueError as exc:
            screen.post_message(ReplyFinished(None, str(exc)))
        except Exception as exc:  # the engine saved what it could; the app goes on
            log.exception("the reply failed")
            screen.post_message(ReplyFinished(None, f"the reply failed: {exc!r} (details in the log file)"))
        else:
            screen.post_message(ReplyFinished(outcome))

    async def stop(self) -> None:
        """Esc: a waiting message goes back into the box; a reply under way ends after its round."""
        if self.pending is not None:
            text, self.pending = self.pending, None
            await self._take_back(text, "not sent", "info")
            return
        self.stop_requested.set()
        self.stopping = True

    async def _take_back(self, text: str, why: str, kind: str) -> None:
        """Remove a message that was never generated from the transcript, into the prompt box (or,
        if something was typed there since, into the box's history: Up brings it back)."""
        screen = self.screen
        await screen.query(UserTurn).last().remove()
        await self.current.remove()
        self.current = None
        screen.set_replying(False)
        prompt = screen.query_one(PromptInput)
        if prompt.text:
            screen.add_notice(f"{why}: the message is in the box's history (Up brings it back)", kind)
            return
        prompt.load_text(text)
        prompt.move_cursor(prompt.document.end)
        screen.add_notice(f"{why}: the message is back in the box", kind)

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
