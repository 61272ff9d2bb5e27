"""The top bar: which models talk, and the legend of the provenance marks."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from app.chat.widgets.foreground import foreground_style
from app.chat.widgets.marked_text import PROVENANCE_CLASSES

LEGEND = (("draft", "draft"), ("target", "target"), ("offline", "unverified"))  # accepted draft, the target's own


class Legend(Static):
    COMPONENT_CLASSES = set(PROVENANCE_CLASSES.values())

    def __init__(self, marks: bool, **kwargs):
        super().__init__("", markup=False, **kwargs)
        self.marks = marks

    def on_mount(self) -> None:
        self.show(self.marks)

    def show(self, marks: bool) -> None:
        """The colours, and which view shows them: raw text, or Markdown (code by token, prose by gutter)."""
        self.marks = marks
        text = Text()
        for provenance, label in LEGEND:
            text.append("■ " + label, foreground_style(self, PROVENANCE_CLASSES[provenance]))
            text.append("  ")
        if not marks:
            text.append("· Markdown (ctrl+t)")
        self.update(text.rstrip() or text)


class TopBar(Horizontal):
    def __init__(self, title: str, marks: bool, **kwargs):
        super().__init__(**kwargs)
        self.title_text = title
        self.marks = marks

    def compose(self) -> ComposeResult:
        yield Static(self.title_text, markup=False, id="title")
        yield Legend(self.marks, id="legend")
