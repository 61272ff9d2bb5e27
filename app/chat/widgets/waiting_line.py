"""What a reply shows before its first token: what the models are reading, and for how long."""

from __future__ import annotations

import time

from textual.widgets import Static

REDRAW_S = 0.5


class WaitingLine(Static):
    def __init__(self, steady: bool = False, **kwargs):
        super().__init__("", markup=False, **kwargs)
        self.steady = steady  # no seconds: a screen that compares equal from run to run
        self.started = time.monotonic()
        self.reading = ""  # "reading 918 new tokens", once the prompt is made

    def on_mount(self) -> None:
        self._draw()
        if not self.steady:
            self.set_interval(REDRAW_S, self._draw)

    def show_reading(self, prompt_tokens: int, unread_tokens: int) -> None:
        if unread_tokens < prompt_tokens:
            self.reading = f"reading {unread_tokens:,} new tokens ({prompt_tokens:,} in all)"
        else:
            self.reading = f"reading {prompt_tokens:,} tokens"
        self._draw()

    def _draw(self) -> None:
        elapsed = "" if self.steady else f" ({time.monotonic() - self.started:.0f} s)"
        self.update(" · ".join(filter(None, [self.reading, f"waiting for the first token{elapsed}"])))
