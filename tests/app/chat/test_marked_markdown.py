"""The Markdown view keeps provenance: code tokens coloured, markup plain, prose with a gutter."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.app import App, ComposeResult
from textual.widgets import Markdown

import app.chat
from app.chat.widgets.assistant_turn import AssistantTurn
from app.chat.widgets.foreground import foreground_style
from app.chat.widgets.marked_text import MarkedText
from tests.app.chat.test_reply_segments import MARKS, REPLY


class OneReply(App):
    """A reply alone, in the chat's styles, as the transcript shows it."""

    CSS_PATH = str(Path(app.chat.__file__).parent / "chat.tcss")

    def __init__(self, marks: bool = False):
        super().__init__()
        self.marks = marks

    def compose(self) -> ComposeResult:
        yield AssistantTurn(1, self.marks, steady=True)


async def _stream(pilot, pieces=REPLY, marks=MARKS) -> AssistantTurn:
    turn = pilot.app.query_one(AssistantTurn)
    for piece, mark in zip(pieces, marks):  # one token at a time, as a reply streams
        await turn.add([piece], [mark])
    await turn.finish("eos", {})
    await pilot.pause()
    return turn


async def test_code_tokens_carry_their_provenance_and_fences_are_not_shown():
    async with OneReply().run_test(size=(80, 24)) as pilot:
        turn = await _stream(pilot)
        code = turn.query_one("MarkedText.code", MarkedText)
        assert code._text.plain == "def f(x):\n    return x"
        assert code.border_title == "python"
        draft, target = (foreground_style(code, f"provenance--{mark}") for mark in ("draft", "target"))
        styled = {code._text.plain[span.start:span.end]: span.style for span in code._text.spans}
        assert styled["def f(x"] == draft and styled["    return x"] == target, styled
        assert all("`" not in text for text in styled)


async def test_prose_is_rendered_with_a_gutter_of_its_tokens_provenance():
    async with OneReply().run_test(size=(80, 24)) as pilot:
        turn = await _stream(pilot, ["Some **bold", "** words", " and more\n"], ["target", "target", "draft"])
        prose = turn.query_one(Markdown)
        assert prose.has_class("gutter--target") and not prose.has_class("gutter--draft")
        assert prose.source == "Some **bold** words and more"  # rendered from the Markdown source


async def test_switching_views_mid_reply_catches_the_markdown_view_up():
    async with OneReply(marks=True).run_test(size=(80, 24)) as pilot:
        turn = pilot.app.query_one(AssistantTurn)
        await turn.add(REPLY[:5], MARKS[:5])
        await turn.set_marks(False)
        await turn.add(REPLY[5:], MARKS[5:])
        await turn.finish("eos", {})
        await pilot.pause()
        assert turn.query_one("MarkedText.code", MarkedText)._text.plain == "def f(x):\n    return x"
        assert [block.source for block in turn.query(Markdown)] == ["Use a set:", "Done."]


def test_snapshot_a_reply_with_code_in_the_markdown_view(snap_compare):
    async def run_before(pilot) -> None:
        await _stream(pilot)

    assert snap_compare(OneReply(), terminal_size=(60, 14), run_before=run_before)


async def test_a_reply_finished_while_its_last_tokens_are_still_being_shown_renders_once():
    """The chat screen shows tokens from its display timer (a task of its own) and finishes the
    reply from a message handler: the finish can arrive while the timer's update is mounting a
    block. Interleaved, they mounted blocks twice and wrote prose into a code block."""
    for split in range(1, len(REPLY) + 1):
        async with OneReply().run_test(size=(80, 24)) as pilot:
            turn = pilot.app.query_one(AssistantTurn)
            for piece, mark in zip(REPLY[:split - 1], MARKS[:split - 1]):
                await turn.add([piece], [mark])
            showing = asyncio.create_task(turn.add(REPLY[split - 1:], MARKS[split - 1:]))
            await asyncio.sleep(0)  # the timer's update is under way
            await asyncio.wait_for(turn.finish("eos", {}), 10)
            await showing
            await pilot.pause()
            assert [block.source for block in turn.query(Markdown)] == ["Use a set:", "Done."], split
            assert turn.query_one("MarkedText.code", MarkedText)._text.plain == "def f(x):\n    return x", split


FENCE_INFO_STRINGS = ["[/x]", "[@click=app.quit]quit[/]", "[b]bold", "\x1b]52;c;aGk=\x07", "python [red]x[/red]"]


async def test_a_fence_info_string_is_shown_as_text_never_as_markup():
    """A reply's code fence line names the block's title: markup in it ("```[/x]" used to raise
    MarkupError in the display timer and end the chat; "```[@click=...]" added an action) and
    escape sequences are shown as the characters they are."""
    for info in FENCE_INFO_STRINGS:
        async with OneReply().run_test(size=(80, 24)) as pilot:
            turn = await _stream(pilot, ["```" + info + "\n", "x = 1\n", "```\n"], ["target"] * 3)
            code = turn.query_one("MarkedText.code", MarkedText)
            title = code._border_title
            assert title is not None and "\x1b" not in title.plain, info
            assert title.plain.startswith(info.split()[0].replace("\x1b", "\u241b").replace("\x07", "\u2407")), \
                (info, title.plain)
            assert not title.spans, (info, title.spans)  # no style, no action: plain text
            assert code._text.plain == "x = 1"
