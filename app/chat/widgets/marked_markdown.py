"""A reply rendered as Markdown, with provenance where rendering leaves the text in place.

Fenced code blocks are shown as written, so each of their tokens is coloured by where it
came from, as in the raw view; the fence lines are markup and are not shown. Prose is
rendered Markdown, which moves and restyles words: its provenance is a gutter on the left
in the colour of most of its characters' tokens. Segments come from `reply_segments`; only
the last one grows while a reply streams, and it is written to incrementally (a Markdown
stream for prose, appended spans for code), so nothing earlier is redrawn.

Updates are serialized: the chat screen adds a reply's tokens from its display timer, which
runs as a task of its own, and finishes the reply from a message handler, so the two can
overlap; interleaved, they mounted a block twice and wrote prose into a code block.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

from app.chat.widgets.marked_text import MarkedText, printable
from app.chat.widgets.reply_segments import Segment, Span, SegmentSplitter, spans_from

TITLE_CHARS = 40  # of a code block's info string, as its title: a language name, not a sentence
GUTTERS = {"draft": "gutter--draft", "target": "gutter--target", "offline": "gutter--offline"}


class MarkedMarkdown(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._splitter = SegmentSplitter()
        self._shown: list[int] = []  # characters of each segment its block shows
        self._stream: MarkdownStream | None = None  # the last prose block's, while it grows
        self._updating = asyncio.Lock()  # one update at a time, in the order they were asked for

    async def add(self, pieces: list[str], provenance: list[str]) -> None:
        async with self._updating:
            self._splitter.add(pieces, provenance)
            await self._show()

    async def finish(self) -> None:
        async with self._updating:
            self._splitter.finish()
            await self._show()
            await self._stop_stream()

    async def _show(self) -> None:
        segments = self._splitter.segments
        for index in range(max(0, len(self._shown) - 1), len(segments)):
            segment = segments[index]
            last = index == len(segments) - 1
            spans = segment.spans + (self._splitter.visible_tail() if last else [])
            if index == len(self._shown):
                await self._stop_stream()
                await self.mount(self._new_block(segment))
                self._shown.append(0)
            new = spans_from(spans, self._shown[index])
            if not new:
                continue
            self._shown[index] += sum(len(text) for text, _ in new)
            block = self.children[index]
            if segment.kind == "code":
                block.add([text for text, _ in new], [mark for _, mark in new])
            else:
                await self._write_prose(block, "".join(text for text, _ in new))
                self._set_gutter(block, spans)

    @staticmethod
    def _new_block(segment: Segment):
        if segment.kind == "code":
            block = MarkedText(classes="code")
            # The model wrote the info string: Content, not a str, which Textual would parse as markup
            # ("```[/x]" raised MarkupError, "```[@click=...]" made an action); control characters as symbols
            block.border_title = Content(printable(segment.language)[:TITLE_CHARS]) if segment.language else None
            return block
        return Markdown(classes="prose")

    async def _write_prose(self, block: Markdown, text: str) -> None:
        if not text:
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(block)
        await self._stream.write(printable(text))

    async def _stop_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    @staticmethod
    def _set_gutter(block: Markdown, spans: list[Span]) -> None:
        weights = Counter()
        for text, mark in spans:
            weights[mark] += len(text.strip())
        if weights:
            most = weights.most_common(1)[0][0]
            for mark, name in GUTTERS.items():
                block.set_class(mark == most, name)
