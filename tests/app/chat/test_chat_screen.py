"""The chat app driven by Textual's Pilot, on the tiny models and real services."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import threading
import unicodedata

import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text

from app.chat.chat_app import ChatApp
from app.chat.launch import embedded_target
from app.cli import build_parser
from app.chat.problem_screen import ProblemScreen
from app.chat.widgets.assistant_turn import AssistantTurn
from app.chat.widgets.foreground import foreground_style
from app.chat.widgets.marked_text import MarkedText
from app.chat.widgets.prompt_input import PromptInput
from app.chat.widgets.status_line import StatusLine
from app.chat.widgets.top_bar import Legend
from app.chat.widgets.turns import Notice, UserTurn
from tests.app.chat.conftest import answered, send, start_tiny_service, wait_for

SIZE = (100, 32)


def _events(app: ChatApp) -> list[dict]:
    return [json.loads(line) for line in app.engine.chat.path.read_text().splitlines()]


def _plain(widget) -> str:
    """The text a widget shows (a rich table as the console would print it)."""
    content = getattr(widget, "content", None)
    if content is not None and not isinstance(content, (str, Text)):
        console = Console(width=200, file=io.StringIO())
        console.print(content)
        return console.file.getvalue()
    return str(widget.render())


async def _ready(pilot) -> None:
    """The chat started and its prompt box has the focus (given on a later tick)."""
    await wait_for(pilot, lambda: pilot.app.chat_screen.ready, what="the chat to start")
    await wait_for(pilot, lambda: pilot.app.screen.query_one(PromptInput).has_focus, what="the focus")


async def test_a_prompt_is_answered_and_the_prompt_box_stays_enabled(chat_settings, tiny_service):
    """Send: the box stays enabled while the reply streams (what is typed is kept), the reply appears
    marked, the status shows acceptance and tokens per round, the box has the focus, the turn is saved."""
    app = ChatApp(chat_settings(server=tiny_service))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        prompt = app.screen.query_one(PromptInput)
        assert not prompt.disabled
        disabled = []
        app.chat_screen.watch(prompt, "disabled", lambda value: disabled.append(value), init=False)
        turn = await answered(pilot, "def quicksort(arr):")
        assert disabled == []  # not while the reply streamed either
        assert prompt.has_focus and prompt.text == ""
        assert [_plain(w) for w in app.screen.query(UserTurn).first().query(".body")] == ["def quicksort(arr):"]
        assert len(turn.reply.provenance) == 48 and {"draft", "target"} <= set(turn.reply.provenance)
        assert _plain(turn.query_one(MarkedText)) == turn.reply.text.replace("\r\n", "\n") or turn.reply.text
        summary = _plain(turn.query_one(".summary"))
        assert summary.startswith("48 tokens:") and "acceptance" in summary and "tokens/round" in summary
        status = _plain(app.screen.query_one(StatusLine))
        assert status.startswith("hybrid") and "accept" in status and "tok/round" in status
        events = _events(app)
    assert [e["type"] for e in events[:2]] == ["chat", "user"] and events[-1]["type"] == "end"
    assert sum(len(e["ids"]) for e in events if e["type"] == "tokens") == 48


async def _stop_after_ten_tokens(pilot) -> AssistantTurn:
    """Wait until the reply streaming now has 10 tokens, press esc, wait until it ended."""
    screen = pilot.app.chat_screen
    await wait_for(pilot, lambda: screen.stream.current is not None)
    turn = screen.stream.current
    await wait_for(pilot, lambda: len(turn.reply.provenance) >= 10)
    await pilot.press("escape")
    await wait_for(pilot, lambda: not screen.replying)
    return turn


async def test_esc_stops_a_reply_and_keeps_what_came(chat_settings, tiny_service):
    """Esc mid-reply: the reply ends early, stays on screen and on disk marked as stopped; then the
    chat takes a second message and slash commands again (esc used to leave it stuck)."""
    app = ChatApp(chat_settings(server=tiny_service, max_tokens=3000))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        await send(pilot, "tell me everything")
        turn = await _stop_after_ten_tokens(pilot)
        kept = len(turn.reply.provenance)
        assert 10 <= kept < 3000 and turn.reply.stop_reason == "stopped"
        assert "stopped by you" in _plain(turn.query_one(".summary"))
        assert not app.screen.query_one(PromptInput).disabled
        assert "stopping" not in _plain(app.screen.query_one(StatusLine))
        saved = app.engine.conversation.load(app.engine.chat.path).turns[0].reply

        await send(pilot, "/k 2")
        assert app.engine.k == 2 and "k = 2" in _plain(app.screen.query(Notice).last())
        await send(pilot, "and now?")
        second = await _stop_after_ten_tokens(pilot)
        assert second.turn == 2 and second.reply.stop_reason == "stopped" and len(second.reply.provenance) >= 10
        await send(pilot, "/stats")
        assert "per turn" in _plain(app.screen.query(Notice).last())
    assert saved.stop_reason == "stopped" and len(saved.provenance) == kept and saved.text == turn.reply.text


async def test_killing_the_service_mid_reply_goes_offline_marked_and_verifies_again_after(chat_settings):
    """The embedded service is SIGKILLed mid-reply: a notice, the reply completes with unverified tokens
    marked; the service is restarted, the link reconnects, and the next reply is verified again."""
    app = ChatApp(chat_settings(max_tokens=150))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        listener, killed = app.engine.listener, []
        committed = listener.committed

        def kill_after_eight_tokens(turn, provenance, pieces, stats) -> None:
            committed(turn, provenance, pieces, stats)  # on the generation thread, as each round commits
            if stats.generated >= 8 and not killed:
                killed.append(app.engine.service.process.pid)
                os.kill(killed[0], signal.SIGKILL)

        listener.committed = kill_after_eight_tokens
        turn = await answered(pilot, "def quicksort(arr):")
        marks = turn.reply.provenance
        assert killed and len(marks) == 150 and turn.reply.stop_reason == "max_tokens"
        first_offline = marks.index("offline")
        assert first_offline >= 8 and set(marks[:first_offline]) <= {"draft", "target"}
        notes = _plain(turn.query_one(".notes"))
        assert "lost the verification service" in notes and "unverified tokens are marked" in notes
        assert "unverified" in _plain(turn.query_one(".summary"))
        offline_style = foreground_style(turn.query_one(MarkedText), "provenance--offline")
        spans = turn.query_one(MarkedText)._text.spans
        assert offline_style.italic and any(span.style == offline_style for span in spans)

        await wait_for(pilot, lambda: app.engine.connection.connected, what="the reconnect")
        assert app.engine.service.process.pid != killed[0]
        again = await answered(pilot, "and again")
        assert again.reply.provenance and "offline" not in again.reply.provenance


async def test_a_saved_chat_is_resumed_whole_and_continued(chat_settings, tiny_service):
    """Quit, then --resume: both turns are shown as they were (text and marks), and a new turn
    goes to the same file with the earlier turns in its prompt."""
    first = ChatApp(chat_settings(server=tiny_service))
    async with first.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        before = await answered(pilot, "def quicksort(arr):")
        path = first.engine.chat.path
        prompt_tokens = before.reply.stats["prompt_tokens"]

    app = ChatApp(chat_settings(server=tiny_service, resume=path))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        shown = app.screen.query(AssistantTurn).first()
        assert shown.reply.text == before.reply.text and shown.reply.provenance == before.reply.provenance
        assert _plain(app.screen.query(UserTurn).first().query_one(".body")) == "def quicksort(arr):"
        assert "resumed chat" in _plain(app.screen.query(Notice).first())
        after = await answered(pilot, "and in C?")
        assert after.turn == 2 and after.reply.stats["prompt_tokens"] > prompt_tokens + len(before.reply.provenance)
        assert app.engine.chat.path == path
    assert [turn.number for turn in app.engine.conversation.load(path).turns] == [1, 2]


def _problem_shown(app) -> bool:
    """The problem dialog is up with its message and buttons mounted (on a busy machine the screen is
    pushed a moment before its widgets are composed: a query then finds nothing)."""
    return isinstance(app.screen, ProblemScreen) and bool(app.screen.query("#problem-message")) and bool(
        app.screen.query("Button"))


@pytest.mark.parametrize("problem", ["unreachable", "missing_model", "refused_token"])
async def test_a_service_that_cannot_be_used_is_explained_and_offline_is_offered(
        problem, chat_settings, tiny, tmp_path, monkeypatch):
    """Unreachable service, missing target (the message names the fetch command), refused token:
    a dialog says what is wrong and offers offline; accepting it gives unverified replies."""
    service = None
    if problem == "unreachable":
        settings = chat_settings(server="ws://127.0.0.1:9")
        expected = "cannot reach the verification service"
    elif problem == "missing_model":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
        target, why = embedded_target(build_parser().parse_args(["chat"]))  # as `specwire chat` resolves it
        settings = chat_settings(target=target, target_problem=why)
        expected = "specwire models fetch"
    else:
        token_file = tmp_path / "token"
        token_file.write_text("s3cret")
        service, url = start_tiny_service(tiny.target_gguf, "--token-file", str(token_file))
        settings = chat_settings(server=url, token="wrong")
        expected = "refused the token"
    app = ChatApp(settings)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: _problem_shown(app), what="the problem dialog")
            assert expected in _plain(app.screen.query_one("#problem-message"))
            await wait_for(pilot, lambda: app.screen.query("#offline"), what="the offer to go offline")
            await pilot.press("o")
            await _ready(pilot)
            turn = await answered(pilot, "hello")
            assert set(turn.reply.provenance) == {"offline"}
            assert _plain(app.screen.query_one(StatusLine)).startswith("offline")
    finally:
        if service is not None:
            service.kill()


async def test_slash_commands_change_the_chat(chat_settings, tiny_service, tmp_path):
    """/k, /temperature, /system, /marks, /stats, /save, /clear, and an unknown command that keeps its text."""
    app = ChatApp(chat_settings(server=tiny_service, max_tokens=16))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        screen = app.chat_screen
        prompt = screen.query_one(PromptInput)
        status = screen.query_one(StatusLine)

        await send(pilot, "/frobnicate")
        assert prompt.text == "/frobnicate" and "unknown command" in _plain(screen.query(Notice).last())
        await send(pilot, "/k 2")
        assert app.engine.speculator.k == 2 and "k 2" in _plain(status) and prompt.text == ""
        await send(pilot, "/temperature 0.8")
        await wait_for(pilot, lambda: not screen.working, what="the new session")
        assert app.engine.params.temperature == 0.8 and app.engine.connection.connected
        assert "temperature = 0.8" in _plain(screen.query(Notice).last())
        await send(pilot, "/system answer in French")
        assert app.engine.conversation.system == "answer in French"

        turn = await answered(pilot, "hello")
        assert turn.reply.stats["k"] == 2 and turn.reply.stats["temperature"] == 0.8
        await send(pilot, "/marks")
        assert not turn.query_one(MarkedText).display and turn.query_one("Markdown").display
        await send(pilot, "/stats")
        assert "per turn" in _plain(screen.query(Notice).last())
        saved = tmp_path / "out" / "chat.md"
        await send(pilot, f"/save {saved}")
        text = saved.read_text()
        assert "## You\n\nhello" in text and "answer in French" in text and "verified by the target" in text

        previous = app.engine.chat.path
        assert "tok/round" in _plain(status)
        await send(pilot, "/clear")
        assert not screen.query(AssistantTurn) and app.engine.chat is None
        assert "tok/round" not in _plain(status) and "accept" not in _plain(status)  # the old chat's figures
        assert previous.stem in _plain(screen.query(Notice).last())
        await answered(pilot, "a new start")
        assert app.engine.chat.path != previous and len(app.engine.conversation.turns) == 1


async def test_keys_new_lines_earlier_prompts_and_the_command_palette(chat_settings):
    """ctrl+j makes a new line in one message; up and down walk the sent prompts; the palette
    puts a command that takes an argument in the box and runs one that does not."""
    app = ChatApp(chat_settings(offline=True, max_tokens=8))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        prompt = app.screen.query_one(PromptInput)
        assert all(word in str(prompt.placeholder) for word in ("Enter", "ctrl+j", "/help"))
        await pilot.press("a", "ctrl+j", "b", "enter")
        await wait_for(pilot, lambda: app.engine.conversation.turns and not app.chat_screen.replying)
        assert app.engine.conversation.turns[0].user == "a\nb" and prompt.text == ""
        await pilot.press("up")
        assert prompt.text == "a\nb"
        await pilot.press("down")
        assert prompt.text == ""
        await pilot.press("ctrl+p", *"temperature")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, type(app.chat_screen)))
        assert prompt.text == "/temperature "
        prompt.clear()
        await pilot.press("ctrl+p", *"/stats")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "per turn" in _plain(app.screen.query(Notice).last()), what="the stats")


async def test_the_wait_for_the_first_token_is_shown_and_its_time_reported(chat_settings, tiny_service):
    """Until the first token: the reply says how many new tokens the models read and counts the
    seconds, the status line drops the last reply's figures; after: the time to the first token is
    in the reply's summary line and in /stats."""
    app = ChatApp(chat_settings(server=tiny_service, max_tokens=16, steady_display=False))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        await answered(pilot, "hello")
        release = threading.Event()
        generate = app.engine.speculator.generate

        def held_generate(*args, **kwargs):
            release.wait(30)  # as a service reading a long prompt would
            return generate(*args, **kwargs)

        app.engine.speculator.generate = held_generate
        await send(pilot, "word " * 300)
        await wait_for(pilot, lambda: "reading" in _plain(app.chat_screen.stream.current.query_one(".waiting")))
        waiting = app.chat_screen.stream.current.query_one(".waiting")
        match = re.search(r"reading ([\d,]+) new tokens \(([\d,]+) in all\) · waiting for the first token \((\d+) s\)",
                          _plain(waiting))
        assert match, _plain(waiting)
        unread, in_all = int(match[1].replace(",", "")), int(match[2].replace(",", ""))
        assert 300 <= unread < in_all
        status = _plain(app.screen.query_one(StatusLine))
        assert "waiting for the first token" in status and "accept" not in status
        await pilot.pause(1.2)
        assert re.search(r"first token \(([1-9]\d*) s\)", _plain(waiting)), _plain(waiting)
        release.set()
        await wait_for(pilot, lambda: not app.chat_screen.replying)
        turn = app.screen.query(AssistantTurn).last()
        assert not waiting.display
        first = turn.reply.stats["first_token_s"]
        assert first >= 1.0 and f"first token {first:.1f} s" in _plain(turn.query_one(".summary"))
        await send(pilot, "/stats")
        table = _plain(app.screen.query(Notice).last())
        assert "1st token s" in table and f"{first:.2f}" in table


async def test_page_keys_scroll_the_transcript_from_the_prompt_box_and_sending_follows_the_reply(chat_settings):
    """PageUp/PageDown scroll the transcript while the prompt box keeps the focus; a message sent
    while scrolled up brings the view to the bottom and it stays there as the reply grows."""
    app = ChatApp(chat_settings(offline=True, max_tokens=120))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        transcript = app.screen.query_one("#transcript")
        prompt = app.screen.query_one(PromptInput)
        for _ in range(3):
            await send(pilot, "/help")
        await pilot.pause(0.3)
        assert transcript.max_scroll_y > 10 and transcript.scroll_y == transcript.max_scroll_y
        await pilot.press("pageup")
        await pilot.pause(0.3)
        assert transcript.scroll_y < transcript.max_scroll_y and prompt.has_focus
        up = transcript.scroll_y
        await pilot.press("pagedown")
        await pilot.pause(0.3)
        assert transcript.scroll_y > up and prompt.has_focus
        await pilot.press("pageup", "pageup")
        await pilot.pause(0.3)
        assert transcript.scroll_y < transcript.max_scroll_y
        await answered(pilot, "a long one")
        await pilot.pause(0.3)
        assert transcript.scroll_y == transcript.max_scroll_y


async def test_a_light_theme_leaves_no_dark_background_behind_reply_text_or_status(chat_settings):
    """Switch to a light theme after a reply: the provenance-coloured text, the legend and the status
    line carry no background of their own, and take the new theme's colours."""
    app = ChatApp(chat_settings(offline=True, max_tokens=12))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        turn = await answered(pilot, "hello")
        app.theme = "textual-light"
        await pilot.pause(0.5)
        marked = turn.query_one(MarkedText)
        offline = marked.get_component_rich_style("provenance--offline")
        spans = marked._text.spans
        assert spans and all(span.style.bgcolor is None for span in spans)
        assert all(span.style.color == offline.color for span in spans)  # the light theme's colour
        status = app.screen.query_one(StatusLine).render()
        legend = app.screen.query_one(Legend).render()
        for text in (status, legend):
            assert text.spans and all(Style.parse(str(s.style)).bgcolor is None for s in text.spans), text.spans


async def test_the_start_up_clock_stops_behind_the_problem_dialog_and_starts_again_on_retry(chat_settings):
    """Unreachable service: behind the dialog the seconds stand still; "retry" counts afresh."""
    app = ChatApp(chat_settings(server="ws://127.0.0.1:9", steady_display=False))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _problem_shown(app), what="the problem dialog")
        step = app.chat_screen.query_one("#loading-step")
        shown = _plain(step)
        await pilot.pause(2.2)
        assert _plain(step) == shown
        panel = app.chat_screen.query_one("LoadingPanel")
        first_attempt = panel.started
        await wait_for(pilot, lambda: app.screen.query("#retry"), what="the offer to retry")
        await pilot.press("r")
        await wait_for(pilot, lambda: panel.started != first_attempt, timeout_s=10, what="a new attempt's clock")
        await pilot.pause(0.6)
        assert re.search(r"\((0|1|2) s\)", _plain(step)), _plain(step)


async def test_retry_copy_and_edit_act_on_the_last_reply(chat_settings, tiny_service):
    """/retry: the last reply is taken back and made again for the same message; /copy puts it on the
    clipboard (and says there is no code block to copy); /edit: the last
    message and its reply are taken back, the message is in the box, and what is sent replaces it.
    The saved chat replays to the same turns."""
    app = ChatApp(chat_settings(server=tiny_service, max_tokens=16))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        screen = app.chat_screen
        prompt = screen.query_one(PromptInput)
        await answered(pilot, "first question")
        await answered(pilot, "second question")
        first_reply = screen.query(AssistantTurn).first().reply.text

        before = len(screen.query(AssistantTurn))
        await send(pilot, "/retry")
        await wait_for(pilot, lambda: screen.stream.current is None and not screen.replying
                       and len(screen.query(AssistantTurn)) == before and screen.query(AssistantTurn).last().finished)
        assert [t.user for t in app.engine.conversation.turns] == ["first question", "second question"]
        assert [t.number for t in app.engine.conversation.turns] == [1, 2]
        assert len(app.engine.conversation.turns[1].reply.provenance) == 16
        assert [_plain(u.query_one(".body")) for u in screen.query(UserTurn)] == ["first question", "second question"]

        app.engine.conversation.turns[1].reply.pieces.append(" \x1b]52;c;aGk=\x07\x9b2J end")  # as a model may write
        await send(pilot, "/copy")
        copied = app.engine.conversation.turns[1].reply.text.strip()
        # every control character but tab and newline stays behind (the tiny model writes some too)
        assert app.clipboard == "".join(c for c in copied if c in "\t\n" or not unicodedata.category(c) == "Cc")
        assert "\x1b" not in app.clipboard and app.clipboard.endswith("]52;c;aGk=2J end")
        assert "OSC 52" in _plain(screen.query(Notice).last())
        await send(pilot, "/copy code")
        assert "no code block" in _plain(screen.query(Notice).last()) and prompt.text == "/copy code"

        await send(pilot, "/edit")
        assert prompt.text == "second question"
        assert [t.user for t in app.engine.conversation.turns] == ["first question"]
        assert len(screen.query(AssistantTurn)) == 1 and len(screen.query(UserTurn)) == 1
        prompt.load_text("second question, better put")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.engine.conversation.turns) == 2 and not screen.replying
                       and app.engine.conversation.turns[1].reply.stop_reason)
        path = app.engine.chat.path
    saved = app.engine.conversation.load(path)
    assert [(t.number, t.user) for t in saved.turns] == [(1, "first question"), (2, "second question, better put")]
    assert saved.turns[0].reply.text == first_reply and len(saved.turns[1].reply.provenance) == 16


async def test_the_context_meter_counts_what_the_conversation_takes_of_the_context(chat_settings):
    """After each reply the status line shows the prompt and reply tokens of the context, growing
    turn by turn; a new chat starts it again."""
    app = ChatApp(chat_settings(offline=True, max_tokens=16, context=256))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        status = app.screen.query_one(StatusLine)
        assert "ctx" not in _plain(status)
        used = []
        for text in ("hello", "and more words to make it grow", "once more"):
            turn = await answered(pilot, text)
            used.append(turn.reply.stats["prompt_tokens"] + len(turn.reply.provenance))
            assert f"ctx {used[-1]:,}/256" in _plain(status), _plain(status)
        assert used[0] < used[1] < used[2]
        await send(pilot, "/clear")
        assert "ctx" not in _plain(status)


async def test_a_reply_that_ends_while_its_tokens_are_drawn_leaves_the_status_of_the_saved_turn(
        chat_settings, monkeypatch):
    """The display timer's update and the reply's end are handled one after the other. Run on the
    timer's own task, a slow update (a long Markdown block) let the end be handled in its middle,
    and the update then put the context gauge back to the prompt alone."""
    original_add = AssistantTurn.add
    calls = []

    async def slow_add(self, pieces, provenance):
        calls.append(len(pieces))
        if len(calls) == 1:  # the first update is slow; the reply ends meanwhile
            await asyncio.sleep(0.3)
        await original_add(self, pieces, provenance)

    monkeypatch.setattr(AssistantTurn, "add", slow_add)
    app = ChatApp(chat_settings(offline=True, max_tokens=200))  # long enough to span a redraw or two
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        await answered(pilot, "hello")
        await pilot.pause(0.8)  # any update still under way ends
        screen = app.chat_screen
        assert len(calls) >= 2  # the reply outlasted the first update
        assert screen.context_used == screen._context_of_saved_turns() > screen.stream.prompt_tokens


async def test_marks_off_in_the_settings_starts_with_rendered_markdown(chat_settings):
    """marks = false (the config file's [chat]): replies come as Markdown, and the legend says so."""
    app = ChatApp(chat_settings(offline=True, max_tokens=8, marks=False))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        turn = await answered(pilot, "hello")
        assert not turn.query_one(MarkedText).display and turn.query_one("Markdown").display
        assert "Markdown (ctrl+t)" in _plain(app.screen.query_one(Legend))


async def test_saved_chats_are_listed_opened_and_deleted_inside_the_app(chat_settings):
    """/chats (and ctrl+o) lists the saved chats; /chats open N shows that chat and goes on in its file;
    /chats delete removes another one and refuses the one open here."""
    app = ChatApp(chat_settings(offline=True, max_tokens=8))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot)
        screen = app.chat_screen
        await answered(pilot, "the first chat")
        first = app.engine.conversation.chat_id
        await send(pilot, "/clear")
        await answered(pilot, "the second chat")
        second = app.engine.conversation.chat_id
        await pilot.press("ctrl+o")
        listing = _plain(screen.query(Notice).last())
        assert f"{second}" in listing and "(this chat)" in listing and "the first chat" in listing
        assert listing.index(second) < listing.index(first)  # newest first

        await send(pilot, "/chats open 2")
        assert app.engine.conversation.chat_id == first
        assert [_plain(u.query_one(".body")) for u in screen.query(UserTurn)] == ["the first chat"]
        assert f"opened chat {first}: 1 turn" in _plain(screen.query(Notice).last())
        await answered(pilot, "back to the first")
        assert [t.user for t in app.engine.conversation.load(app.engine.chat.path).turns] == [
            "the first chat", "back to the first"]

        await send(pilot, f"/chats delete {first}")
        assert "the chat open here" in _plain(screen.query(Notice).last())
        await send(pilot, f"/chats delete {second}")
        assert f"deleted chat {second}" in _plain(screen.query(Notice).last())
        assert [s.id for s in app.engine.store.list()] == [first]
