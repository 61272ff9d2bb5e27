"""The chat screen: it coordinates the transcript, the prompt box, the status line and the engine.

Every blocking call into the engine (starting, replying, connecting, new sampling
settings) runs in the one exclusive thread worker group "engine"; the engine answers with
messages (app/chat/messages.py), and only this screen's handlers change the widgets.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer

from app.chat.engine import ChatEngine
from app.chat.messages import (
    CommandDone,
    ConnectionChanged,
    EngineReady,
    NoteAdded,
    Progress,
    ReplyFinished,
    ReplyStarted,
    ScreenListener,
    StartupFailed,
    TokensCommitted,
)
from app.chat.problem_screen import ProblemScreen
from app.chat.reply_stream import STREAM_FPS, ReplyStream
from app.chat.settings import ChatSettings
from app.chat.slash_commands import is_command
from app.chat.slash_handlers import SlashHandlers
from app.chat.state import BusyError, Connection, LiveStats, StartupProblem
from app.chat.widgets.assistant_turn import AssistantTurn
from app.chat.widgets.loading_panel import LoadingPanel
from app.chat.widgets.marked_text import MarkedText
from app.chat.widgets.prompt_input import PromptInput
from app.chat.widgets.status_line import StatusLine
from app.chat.widgets.top_bar import Legend, TopBar
from app.chat.widgets.turns import Notice, UserTurn
from models.registry import RegistryError, get_pair

log = logging.getLogger(__name__)


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "stop_reply", "Stop"),
        Binding("ctrl+t", "toggle_marks", "Marks"),
        Binding("ctrl+o", "list_chats", "Chats"),
        # priority: the prompt box has the focus and would move its cursor instead
        Binding("pageup", "scroll_transcript(-1)", "Scroll up", show=False, priority=True),
        Binding("pagedown", "scroll_transcript(1)", "Scroll down", show=False, priority=True),
    ]

    def __init__(self, settings: ChatSettings, engine: ChatEngine):
        super().__init__()
        self.settings = settings
        self.engine = engine
        engine.listener = ScreenListener(self)  # the engine's reports become this screen's messages
        self.commands = SlashHandlers(self)
        self.marks = settings.marks  # provenance marks: the point of the tool; ctrl+t shows rendered Markdown
        self.ready = False
        self.replying = False
        self.working = ""  # what a slow command is doing ("connecting ..."), shown in the status line
        self.stream = ReplyStream(self)  # the reply on screen, from its start to its end
        self.stats = LiveStats(self.engine.mode, settings.k, 0)
        self.problem: StartupProblem | None = None  # the last startup problem shown
        self.context_used = self._context_of_saved_turns()

    # ---- layout ---------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield TopBar(self.chat_title(), self.marks)
        conversation = self.engine.conversation
        with VerticalScroll(id="transcript"):
            if self.settings.resume:
                yield Notice(f"resumed chat {conversation.chat_id}: {len(conversation.turns)} turn"
                             f"{'s' if len(conversation.turns) != 1 else ''}")
            yield from self._turn_widgets()
            yield LoadingPanel(self.settings.steady_display)
        # Enabled from the start: a message sent before the service is up waits for it (ReplyStream).
        prompt = PromptInput(sent_prompts=[turn.user for turn in conversation.turns], id="prompt")
        if self.settings.steady_display:
            prompt.cursor_blink = False
        yield prompt
        yield StatusLine(self.settings.steady_display, id="status")
        yield Footer()

    def _turn_widgets(self):
        for turn in self.engine.conversation.turns:
            yield UserTurn(turn.user)
            yield AssistantTurn(turn.number, self.marks, self.settings.steady_display,
                                reply=dataclasses.replace(turn.reply))

    async def show_conversation(self) -> None:
        """The engine opened another saved chat: show its turns instead of this one's."""
        transcript = self.query_one("#transcript", VerticalScroll)
        await transcript.remove_children()
        await transcript.mount_all(list(self._turn_widgets()))
        self.query_one(PromptInput).sent_prompts[:] = [turn.user for turn in self.engine.conversation.turns]
        self.stats = self.engine.live_stats()
        self.context_used = self._context_of_saved_turns()
        self.follow_transcript()
        self.show_status()

    def chat_title(self) -> str:
        if self.settings.server:
            target = self.settings.server
        elif self.settings.target:
            target = Path(self.settings.target).name
        else:  # no target file: told properly when the service would start
            try:
                target = get_pair(self.settings.pair).target.filename
            except RegistryError:
                target = f"pair {self.settings.pair or 'default'}"
        return f"specwire · {self.settings.draft.name.removesuffix('.gguf')} ⇢ {target.removesuffix('.gguf')}"

    def on_mount(self) -> None:
        self.query_one("#transcript", VerticalScroll).anchor()
        self.app.theme_changed_signal.subscribe(self, self._restyle)
        self.show_status()
        # A fast drafter commits hundreds of rounds a second: redraw at a steady rate instead
        # of once a round, so the screen never holds the generation back. The timer only queues
        # the update: run on the timer's own task it overlapped the handlers (a reply's end, a
        # command), which then saw a half-shown reply.
        self.set_interval(1 / STREAM_FPS, lambda: self.call_later(self.stream.show_tokens))
        self.query_one(PromptInput).focus()
        self.start_engine()

    def _restyle(self, theme) -> None:
        """A new theme: text styled by provenance or status takes the new colours."""
        for marked in self.query(MarkedText):
            marked.restyle()
        legend = self.query_one(Legend)
        legend.show(legend.marks)
        self.show_status()

    def on_unmount(self) -> None:
        self.stream.stop_requested.set()
        self.engine.close()

    # ---- starting -------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def start_engine(self) -> None:
        self._engine_call(self.engine.start, ready=True)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def connect_engine(self, ready: bool) -> None:
        self._engine_call(self.engine.connect, ready=ready, done="online: rounds are verified by the target")

    def _engine_call(self, call: Callable[[], None], ready: bool, done: str = "") -> None:
        """Run a blocking engine call; report a startup problem (before ready) or a command's end."""
        try:
            call()
        except StartupProblem as problem:
            self.post_message(StartupFailed(problem) if ready else CommandDone(f"could not go online: {problem}", True))
            return
        except BusyError as exc:
            self.post_message(CommandDone(f"{exc}: wait for it to end (or press esc)", True))
            return
        except Exception as exc:  # never a crash: say what happened, keep the chat
            log.exception("engine call failed")
            problem = StartupProblem("error", f"{exc!r} (details in the log file)",
                                     offline_possible=self.engine.speculator is not None, retry_possible=False)
            self.post_message(StartupFailed(problem) if ready else CommandDone(str(problem), True))
            return
        self.post_message(EngineReady() if ready else CommandDone(done))

    def on_progress(self, message: Progress) -> None:
        panels = self.query(LoadingPanel)
        for panel in panels:
            panel.show(message.text, message.from_service)
        if not panels and self.working and not message.from_service:  # /online: steps in the status line
            self.working = message.text
            self.show_status()

    async def on_engine_ready(self, message: EngineReady) -> None:
        self.working = ""
        await self.query(LoadingPanel).remove()
        self.ready = True
        if not self.replying:
            self.query_one(PromptInput).focus()
        self.show_status()
        await self.stream.run_pending()

    def on_startup_failed(self, message: StartupFailed) -> None:
        self.problem = message.problem
        if self.stream.pending is not None and message.problem.offline_possible and self.drafting_model():
            # A message waits: answer it offline, as a service lost mid-reply is handled.
            self.stream.current.add_note(f"the verification service did not come ({message.problem}): "
                                         "answered offline, unverified tokens are marked (/online tries again)")
            self._after_problem("offline")
            return
        for panel in self.query(LoadingPanel):
            panel.stop_clock()  # behind the dialog nothing is being waited for
        self.app.push_screen(ProblemScreen(message.problem), self._after_problem)

    def _after_problem(self, answer: str | None) -> None:
        if answer == "offline":
            self.engine.go_offline()
            self.post_message(EngineReady())
        elif answer == "retry":
            for panel in self.query(LoadingPanel):
                panel.restart_clock("retrying")
            self.connect_engine(ready=True)
        else:
            unsent = f"\nyour message was not sent: {self.stream.pending}" if self.stream.pending else ""
            self.app.exit(return_code=2, message=f"specwire chat: {self.problem}{unsent}")

    # ---- sending and streaming ------------------------------------------------------

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text
        if not text.strip():
            return
        if is_command(text) and not self.ready:
            self.add_notice("the chat is still starting: commands wait until it is ready", "warning")
            return
        if is_command(text):
            await self.commands.carry_out(text)
            return
        if self.replying:
            self.add_notice("wait for the reply to end (or press esc to stop it)", "warning")
            return
        text = text[1:] if text.startswith("//") else text
        try:
            if self.engine_waited_for() is None:  # else checked when the engine takes it
                self.engine.check_prompt(text)
        except ValueError as exc:  # too long: the text stays in the box to be shortened
            self.add_notice(str(exc), "error")
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(message.text)
        prompt.clear()
        await self.start_reply(text)

    async def start_reply(self, text: str) -> None:
        """Show the message and an empty reply, and generate it on the engine's worker."""
        await self.stream.start(text)

    def engine_waited_for(self) -> str | None:
        """What a message sent now must wait for before the engine takes it (None: nothing)."""
        if not self.ready:
            return "the verification service"
        return f"the chat ({self.working})" if self.working else None

    def drafting_model(self) -> bool:
        """A draft model runs here, so the chat can go on offline (not so with --draft ngram)."""
        return self.engine.drafting != "ngram"

    def on_reply_started(self, message: ReplyStarted) -> None:
        self.stream.reading(message)

    def on_tokens_committed(self, message: TokensCommitted) -> None:
        self.stream.committed(message)

    async def on_reply_finished(self, message: ReplyFinished) -> None:
        await self.stream.finish(message)
        self.context_used = self._context_of_saved_turns()
        self.stats = self.engine.live_stats()
        self.set_replying(False)

    def on_note_added(self, message: NoteAdded) -> None:
        turns = [t for t in self.query(AssistantTurn) if t.turn == message.turn] if message.turn else []
        if turns:
            turns[-1].add_note(message.text)
        else:
            self.add_notice(message.text, "warning")
        self.show_status()

    def on_connection_changed(self, message: ConnectionChanged) -> None:
        self.show_status()

    def set_replying(self, replying: bool) -> None:
        # The box stays enabled and focused: what is typed meanwhile is kept for the next message
        # (a disabled box dropped the keys, and moved the focus that an esc then had to find).
        self.replying = replying
        if not replying:
            self.query_one(PromptInput).focus()
        self.refresh_bindings()
        self.show_status()

    async def on_prompt_input_stop_requested(self, message: PromptInput.StopRequested) -> None:
        await self.action_stop_reply()  # esc typed into the box, after the Enter typed before it

    async def action_stop_reply(self) -> None:
        if self.replying:
            # Not `working`: that blocks commands until a slow command ends, and the reply's end is
            # what ends a stop.
            await self.stream.stop()
            self.show_status()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop_reply":
            return self.replying  # shown in the footer only while a reply streams
        return True

    async def action_list_chats(self) -> None:
        await self.commands.carry_out("/chats", keep_prompt=True)

    def action_scroll_transcript(self, pages: int) -> None:
        transcript = self.query_one("#transcript", VerticalScroll)
        if pages < 0:
            transcript.scroll_page_up()  # releases the anchor: the view stays where the user put it
        else:
            transcript.scroll_page_down()

    def follow_transcript(self) -> None:
        """Scroll to the bottom and stay there as the reply grows (after the user scrolled up too)."""
        self.query_one("#transcript", VerticalScroll).anchor()

    async def action_toggle_marks(self) -> None:
        self.marks = not self.marks
        self.query_one(Legend).show(self.marks)
        for turn in self.query(AssistantTurn):
            await turn.set_marks(self.marks)

    # ---- slash commands -------------------------------------------------------------

    def refuse_while_busy(self) -> None:
        if self.replying or self.working:
            raise BusyError(self.working or "a reply is in progress")

    def run_slow(self, call: Callable[[], None], doing: str, done: str) -> None:
        """A command that blocks (connecting, new settings): on the engine's worker, shown as `doing`."""
        self.refuse_while_busy()
        self.working = doing
        self.show_status()
        self._run_slow(call, done)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _run_slow(self, call: Callable[[], None], done: str) -> None:
        self._engine_call(call, ready=False, done=done)

    def start_connecting(self) -> None:
        """/online: connect on the engine's worker; the steps show in the status line."""
        self.working = "connecting"
        self.show_status()
        self.connect_engine(ready=False)

    async def withdraw_last_turn(self):
        """Take the last turn back, from the engine and from the transcript; the turn taken."""
        self.refuse_while_busy()
        turn = self.engine.withdraw_last()
        for shown in (self.query(UserTurn), self.query(AssistantTurn)):
            if shown:
                await shown.last().remove()
        self.context_used = self._context_of_saved_turns()
        self.show_status()
        return turn

    async def clear_transcript(self) -> None:
        await self.query_one("#transcript", VerticalScroll).remove_children()
        self.query_one(PromptInput).sent_prompts.clear()
        self.stats = self.engine.live_stats()  # the new chat's: none yet
        self.context_used = 0
        self.show_status()

    async def on_command_done(self, message: CommandDone) -> None:
        self.working = ""
        self.add_notice(message.text, "error" if message.error else "info")
        self.stats = dataclasses.replace(self.stats, mode=self.engine.mode)
        self.show_status()
        await self.stream.run_pending()

    # ---- helpers --------------------------------------------------------------------

    def _context_of_saved_turns(self) -> int:
        """Tokens the conversation takes after its last finished reply: that reply's prompt and tokens."""
        turns = self.engine.conversation.turns
        if not turns:
            return 0
        reply = turns[-1].reply
        return reply.stats.get("prompt_tokens", 0) + len(reply.token_ids)

    def add_notice(self, text, kind: str = "info") -> None:
        self.query_one("#transcript", VerticalScroll).mount(Notice(text, kind))

    def show_status(self) -> None:
        stats = dataclasses.replace(self.stats, mode=self.engine.mode, k=self.engine.k)
        connection = self.engine.connection
        if not self.ready and not self.working:  # show the mode the chat is starting into
            mode = "offline" if self.settings.offline else "remote" if self.engine.k == 0 else "hybrid"
            stats, connection = dataclasses.replace(stats, mode=mode), Connection(False, "starting")
        waiting_for = self.stream.waiting_for if self.replying else ""  # the service, or the first token
        doing = self.working or ("stopping" if self.stream.stopping else
                                 f"waiting for {waiting_for}" if waiting_for else "")
        busy = doing + " ..." if doing else ""
        self.query_one(StatusLine).show(stats, connection, busy, (self.context_used, self.engine.context_limit))
