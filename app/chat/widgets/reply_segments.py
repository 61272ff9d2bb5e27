"""A streaming reply cut into prose and fenced code, each span keeping its provenance.

Rendering Markdown moves and restyles prose, so a token's colour has nowhere to go there; the
body of a fenced code block is shown as it was written, so its tokens keep their place. The
splitter follows the stream line by line: a line that opens or closes a fence (```) ends a
segment and is itself markup, shown by no segment. Only the last segment grows, so a view
redraws only that one, and the cost of a reply stays linear in its length.

A line still being written is not part of any segment yet: it may turn out to be a fence.
`visible_tail()` says how much of it can be shown already (any line that does not begin with
a backtick cannot become a fence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FENCE = "```"

Span = tuple[str, str]  # (text, provenance)


@dataclass
class Segment:
    kind: str  # "prose" or "code"
    language: str = ""  # a code block's info string (```python)
    spans: list[Span] = field(default_factory=list)
    owed: Span | None = None  # the newline after the last line, added when another line joins it

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.spans)


class SegmentSplitter:
    def __init__(self) -> None:
        self.segments = [Segment("prose")]
        self._line: list[Span] = []  # the line being written

    def add(self, pieces: list[str], provenance: list[str]) -> None:
        for piece, mark in zip(pieces, provenance):
            parts = piece.split("\n")
            for index, part in enumerate(parts):
                if part:
                    self._line.append((part, mark))
                if index < len(parts) - 1:
                    self._end_line(mark)

    def finish(self) -> None:
        """The reply is over: its last line, unended, is a line like the others."""
        if self._line:
            self._end_line(None)

    def visible_tail(self) -> list[Span]:
        """The part of the line being written that can be shown in the last segment now."""
        text = "".join(text for text, _ in self._line).lstrip()
        if not text or text.startswith("`"):
            return []
        owed = self.segments[-1].owed
        return ([owed] if owed else []) + self._line

    def _end_line(self, newline_mark: str | None) -> None:
        text = "".join(text for text, _ in self._line).strip()
        current = self.segments[-1]
        if current.kind == "prose" and text.startswith(FENCE):
            self.segments.append(Segment("code", language=text.lstrip("`").strip()))
        elif current.kind == "code" and text.startswith(FENCE) and not text.strip("`"):
            self.segments.append(Segment("prose"))
        else:  # a line of the segment; its newline waits for the next (a block's last line has none)
            if current.owed:
                current.spans.append(current.owed)
            current.spans.extend(self._line)
            current.owed = ("\n", newline_mark) if newline_mark is not None else None
        self._line = []


def spans_from(spans: list[Span], offset: int) -> list[Span]:
    """The spans after the first `offset` characters (a span cut there keeps its provenance)."""
    out, position = [], 0
    for text, mark in spans:
        end = position + len(text)
        if end > offset:
            out.append((text[max(0, offset - position):], mark))
        position = end
    return out
