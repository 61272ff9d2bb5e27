"""What each slash command does (app/chat/slash_commands.py says what exists and parses it).

Each handler is `async def name(argument)`: it changes the chat through the engine and
tells the user through the screen. A ValueError's message is shown as an error and the
command's text stays in the box to be fixed; a BusyError says the reply must end first.
`carry_out` runs a command typed in the box, `from_palette` one picked in the palette.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Protocol

import msgspec

from app.chat.copying import code_blocks, parse_copy_argument
from app.chat.engine import ChatEngine
from app.chat.export import default_path, save_markdown
from app.chat.settings import ChatSettings
from app.chat.slash_commands import SlashCommand, help_text, parse, parse_temperature
from app.chat.state import BusyError
from app.chat.stats_table import stats_table
from app.chat.store import ChatInUse, ChatNotFound, ChatSummary, in_use
from app.chat.widgets.prompt_input import PromptInput
from app.generation_flags import parse_k
from wire.visible_text import escaped, without_controls

log = logging.getLogger(__name__)


class ChatView(Protocol):
    """What the handlers need of the chat screen."""

    engine: ChatEngine
    settings: ChatSettings
    app: object

    def query_one(self, selector, expect_type=None): ...
    def run_worker(self, work, **options): ...
    def follow_transcript(self) -> None: ...
    def add_notice(self, text: str, kind: str = "info") -> None: ...
    def show_status(self) -> None: ...
    def chat_title(self) -> str: ...
    def refuse_while_busy(self) -> None: ...
    def run_slow(self, call: Callable[[], None], doing: str, done: str) -> None: ...
    def start_connecting(self) -> None: ...
    async def clear_transcript(self) -> None: ...
    async def withdraw_last_turn(self): ...
    async def start_reply(self, text: str) -> None: ...
    async def action_toggle_marks(self) -> None: ...


class SlashHandlers:
    def __init__(self, screen: ChatView):
        self.screen = screen
        self.engine = screen.engine

    async def carry_out(self, text: str, keep_prompt: bool = False) -> None:
        """Carry out `/name argument`; on an error the text stays in the box to be fixed.

        A command may return text for the box (/edit), which then replaces the command."""
        try:
            command, argument = parse(text)
            for_the_box = await getattr(self, command.name)(argument)
        except ValueError as exc:
            self.screen.add_notice(str(exc), "error")
            return
        except BusyError:
            self.screen.add_notice("that has to wait for the reply to end (or press esc to stop it)", "warning")
            return
        except Exception as exc:  # a bug in one command must not take the chat down
            log.exception("command %s failed", text)
            self.screen.add_notice(f"{text.split()[0]} failed: {exc!r} (details in the log file)", "error")
            return
        prompt = self.screen.query_one(PromptInput)
        if keep_prompt:  # from a key, not typed: what is in the box stays
            self.screen.follow_transcript()
            return
        prompt.remember(text)
        prompt.clear()
        if for_the_box:
            prompt.load_text(for_the_box)
            prompt.move_cursor(prompt.document.end)
        self.screen.follow_transcript()  # what the command said is at the bottom

    def from_palette(self, command: SlashCommand) -> None:
        """From the command palette: run it, or put it in the box when it takes an argument."""
        if command.argument:
            prompt = self.screen.query_one(PromptInput)
            prompt.load_text(f"/{command.name} ")
            prompt.move_cursor(prompt.document.end)
            prompt.focus()
        else:
            self.screen.run_worker(self.carry_out(f"/{command.name}"), exclusive=False)

    async def help(self, argument: str) -> None:
        self.screen.add_notice(help_text())

    async def offline(self, argument: str) -> None:
        if self.engine.link is None:
            raise ValueError("already offline: /online verifies again")
        if self.engine.drafting == "ngram":
            raise ValueError("n-gram drafting (--draft ngram) has no local model: there is no offline mode")
        self.screen.run_slow(self.engine.go_offline, "going offline", "offline: the draft model alone, tokens unverified")

    async def online(self, argument: str) -> None:
        if self.engine.link is not None:
            raise ValueError(f"already online ({self.engine.connection.detail})")
        self.screen.refuse_while_busy()
        self.screen.start_connecting()

    async def k(self, argument: str) -> None:
        self.screen.refuse_while_busy()
        self.engine.set_k(parse_k(argument))
        k = self.engine.k
        self.screen.add_notice("k = auto: the draft length is chosen each round" if k is None else
                               "k = 0: the service writes every token (remote mode)" if k == 0 else
                               f"k = {k} draft tokens per round")
        self.screen.show_status()

    async def temperature(self, argument: str) -> None:
        self.screen.refuse_while_busy()
        params = msgspec.structs.replace(self.engine.params, temperature=parse_temperature(argument)).checked()
        self.screen.run_slow(lambda: self.engine.set_params(params), "new sampling settings",
                             f"temperature = {params.temperature:g}" + (" (greedy)" if params.greedy else ""))

    async def system(self, argument: str) -> None:
        if not argument:
            current = self.engine.conversation.system
            self.screen.add_notice(f"system prompt: {current}" if current else
                                   "no system prompt of yours: the chat template's default applies")
            return
        self.screen.refuse_while_busy()
        text = "" if argument == "-" else argument
        self.engine.set_system(text)
        self.screen.add_notice("system prompt removed" if not text else f"system prompt set: {text}")

    async def marks(self, argument: str) -> None:
        await self.screen.action_toggle_marks()

    async def stats(self, argument: str) -> None:
        if not self.engine.conversation.turns:
            raise ValueError("no turns yet: statistics come with the first reply")
        self.screen.add_notice(stats_table(self.engine.conversation, self.screen.settings.steady_display))

    async def save(self, argument: str) -> None:
        conversation = self.engine.conversation
        if not conversation.turns:
            raise ValueError("nothing to save yet")
        try:
            path = save_markdown(conversation, self.screen.chat_title().removeprefix("specwire · "),
                                 Path(argument) if argument else default_path(conversation))
        except OSError as exc:
            raise ValueError(f"cannot write {argument or default_path(conversation)}: {exc.strerror or exc}") from exc
        self.screen.add_notice(f"saved as {path}")

    async def clear(self, argument: str) -> None:
        self.screen.refuse_while_busy()
        previous = self.engine.conversation.chat_id
        self.engine.new_chat()
        await self.screen.clear_transcript()
        self.screen.add_notice("a new chat" + (f"; the previous one is saved: specwire chat --resume {previous}"
                                               if previous else ""))

    async def retry(self, argument: str) -> None:
        turn = await self.screen.withdraw_last_turn()
        await self.screen.start_reply(turn.user)

    async def edit(self, argument: str) -> str:
        turn = await self.screen.withdraw_last_turn()
        self.screen.add_notice("the last message is back in the box: change it and send it again")
        return turn.user

    async def copy(self, argument: str) -> None:
        which = parse_copy_argument(argument)
        replies = [turn.reply for turn in self.engine.conversation.turns if turn.reply.text]
        if not replies:
            raise ValueError("no reply to copy yet")
        text = replies[-1].text.strip()
        if which is not None:
            blocks = code_blocks(text)
            if not blocks:
                raise ValueError("the last reply has no code block: /copy takes all of it")
            if which >= len(blocks):
                raise ValueError(f"the last reply has {len(blocks)} code block{'s' if len(blocks) > 1 else ''}")
            text = blocks[which]
        # OSC 52: the terminal puts it on the system clipboard; nothing says whether it did. Pasted into a
        # terminal, an escape sequence of the model's would run there: control characters stay behind
        text = without_controls(text)
        self.screen.app.copy_to_clipboard(text)
        what = "the last reply" if which is None else "a code block"
        self.screen.add_notice(f"copied {what} ({len(text):,} characters) to the terminal's clipboard (OSC 52). "
                               "If nothing pasted: the terminal does not take OSC 52 (tmux: set-clipboard on); "
                               "/save writes the chat to a file")

    async def chats(self, argument: str) -> None:
        action, _, which = argument.partition(" ")
        store, current = self.engine.store, self.engine.conversation.chat_id
        summaries = store.list()
        if not action:
            self.screen.add_notice(chat_list(summaries, current) if summaries else f"no saved chats in {store.root}")
            return
        if action not in ("open", "delete") or not which.strip():
            raise ValueError("/chats lists the saved chats; /chats open N|ID, /chats delete N|ID")
        chat_id = chat_by_number_or_id(which.strip(), summaries)
        try:
            if action == "open":
                self.screen.refuse_while_busy()
                self.engine.open_chat(chat_id)
                await self.screen.show_conversation()
                turns = len(self.engine.conversation.turns)
                self.screen.add_notice(f"opened chat {self.engine.conversation.chat_id}: {turns} turn"
                                       f"{'s' if turns != 1 else ''}" + (f"; the previous one is saved: {current}"
                                                                        if current else ""))
            else:
                if current and store.path_of_any(chat_id).stem == current:
                    raise ValueError("that is the chat open here: /clear or /chats open another first")
                path = store.delete(chat_id)
                self.screen.add_notice(f"deleted chat {path.stem}")
        except (ChatNotFound, ChatInUse) as exc:
            raise ValueError(str(exc)) from exc

    async def quit(self, argument: str) -> None:
        self.screen.app.exit()


def chat_list(summaries: list[ChatSummary], current: str | None) -> str:
    """The saved chats, newest first and numbered for /chats open N."""
    width = max(len(s.id) for s in summaries)
    lines = [f"{'#':>3}  {'ID':{width}}  {'STARTED':16}  TURNS  FIRST MESSAGE"]
    for number, s in enumerate(summaries, 1):
        where = " (this chat)" if s.id == current else " (open elsewhere)" if in_use(s.path) else ""
        lines.append(f"{number:>3}  {escaped(s.id):{width}}  {escaped(s.created[:16]).replace('T', ' '):16}  "
                     f"{s.turns:5d}  {escaped(s.title[:50])}{where}")
    lines += ["", "/chats open N|ID continues one · /chats delete N|ID removes one"]
    return "\n".join(lines)


def chat_by_number_or_id(which: str, summaries: list[ChatSummary]) -> str:
    """`3` -> the id of the third chat of the list; anything else is an id (or a start of one)."""
    if which.isdigit() and len(which) < 4:  # ids start with a date: 8 digits
        number = int(which)
        if not 1 <= number <= len(summaries):
            raise ValueError(f"there are {len(summaries)} saved chats: /chats lists them")
        return summaries[number - 1].id
    return which
