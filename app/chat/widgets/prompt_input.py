"""The prompt box: multi-line; Enter sends, ctrl+j (or alt+enter) starts a new line.

Terminals send the same byte for Enter and shift+Enter, so the newline key is ctrl+j
(a line feed, which every terminal sends distinctly) or alt+Enter; shift+Enter works too
where the terminal reports it. Up and Down on the first or last line walk through the
prompts sent before.

Esc in the box is posted as a StopRequested message of the box's own. Keys a terminal
delivers together are queued on the box before it handles the first, so the Submitted of
an Enter lands behind the esc typed after it: the esc, bubbling up as a key, reached the
screen first, found no reply to stop, and the reply ran on. As a message it keeps its
place after the Submitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


PLACEHOLDER = "Message · Enter sends · ctrl+j new line · /help commands"


class PromptInput(TextArea):
    BINDINGS = [
        Binding("ctrl+j", "newline", "Newline", key_display="ctrl+j"),
        Binding("alt+enter,shift+enter", "newline", "Newline", show=False),
    ]

    @dataclass
    class Submitted(Message):
        text: str

    class StopRequested(Message):
        """Esc, in the order of the messages sent before it."""

    def __init__(self, sent_prompts: list[str] | None = None, **kwargs):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", placeholder=PLACEHOLDER,
                         **kwargs)
        self.sent_prompts = list(sent_prompts or [])
        self._browsing: int | None = None  # None: editing a new prompt
        self._draft_text = ""  # the unsent prompt while the history is browsed

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key == "escape":
            event.stop()
            event.prevent_default()
            self.post_message(self.StopRequested())
            return
        if event.key == "up" and self.cursor_location[0] == 0 and self._browse(-1):
            event.stop()
            event.prevent_default()
            return
        if event.key == "down" and self.cursor_location[0] == self.document.line_count - 1 and self._browse(1):
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        self.insert("\n")

    def remember(self, text: str) -> None:
        if text and (not self.sent_prompts or self.sent_prompts[-1] != text):
            self.sent_prompts.append(text)
        self._browsing = None

    def _browse(self, step: int) -> bool:
        """Show the previous (-1) or next (+1) sent prompt; False when there is none."""
        if not self.sent_prompts or (self._browsing is None and step > 0):
            return False
        if self._browsing is None:
            self._draft_text = self.text
            index = len(self.sent_prompts) - 1
        else:
            index = self._browsing + step
        if index < 0:
            return False
        if index >= len(self.sent_prompts):
            self._browsing = None
            self.load_text(self._draft_text)
        else:
            self._browsing = index
            self.load_text(self.sent_prompts[index])
        self.move_cursor(self.document.end)
        return True
