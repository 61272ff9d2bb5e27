"""The simple parts of the transcript: the user's turns and notices."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Static

from app.chat.widgets.marked_text import printable


class UserTurn(Vertical):
    def __init__(self, text: str, **kwargs):
        super().__init__(**kwargs)
        self.text = text

    def compose(self) -> ComposeResult:
        yield Label("You", classes="role")
        yield Static(printable(self.text), markup=False, classes="body")


class Notice(Static):
    """A line from the chat itself (help, statistics, the service's comings and goings)."""

    def __init__(self, text, kind: str = "info", **kwargs):
        super().__init__(text, markup=False, classes=f"notice -{kind}", **kwargs)
