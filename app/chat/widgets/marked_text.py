"""A reply as plain text, each token coloured by where it came from.

Accepted draft tokens, the target's own tokens (corrections and bonus tokens) and
unverified offline tokens each get a style from chat.tcss. Model output can hold control
characters, which would move the terminal's cursor: they are shown as visible symbols.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from app.chat.widgets.foreground import foreground_style
from wire.visible_text import visible

PROVENANCE_CLASSES = {"draft": "provenance--draft", "target": "provenance--target", "offline": "provenance--offline"}

def printable(text: str) -> str:
    """`text` safe to put on a terminal: CRLF as LF, other control characters as symbols."""
    return visible(text)


class MarkedText(Static):
    """Streaming text whose every piece carries its provenance's style."""

    COMPONENT_CLASSES = set(PROVENANCE_CLASSES.values())

    def __init__(self, **kwargs):
        super().__init__("", markup=False, **kwargs)
        self._text = Text()
        self._shown: list[tuple[str, str]] = []  # (piece, provenance) in _text, to restyle under a new theme
        self._pending: list[tuple[str, str]] = []  # added before the styles are known

    def add(self, pieces: list[str], provenance: list[str]) -> None:
        self._pending.extend(zip(pieces, provenance))
        if self.is_mounted:
            self._flush()

    def on_mount(self) -> None:
        self._flush()

    def restyle(self) -> None:
        """Draw every piece again with the styles of the theme now in use."""
        self._pending[:0], self._shown, self._text = self._shown, [], Text()
        if self.is_mounted:
            self._flush()

    def _flush(self) -> None:
        for piece, mark in self._pending:
            self._text.append(printable(piece), foreground_style(self, PROVENANCE_CLASSES[mark]))
        self._shown += self._pending
        self._pending = []
        self.update(self._text)
