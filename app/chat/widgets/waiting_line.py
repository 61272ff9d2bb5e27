"""What a reply shows before its first token: what it waits for, what the models read, and for how long.

A message sent while the chat starts or reconnects waits for the service first; the
seconds count from the moment it was sent.
"""

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
        self.waiting_for = "the first token"

    def on_mount(self) -> None:
        self._draw()
        if not self.steady:
            self.set_interval(REDRAW_S, self._draw)

    def wait_for(self, what: str) -> None:
        """What the reply waits for now: "the verification service", then "the first token"."""
        self.waiting_for = what
        self._draw()

    def show_reading(self, prompt_tokens: int, unread_tokens: int) -> None:
        if unread_tokens < prompt_tokens:
            self.reading = f"reading {unread_tokens:,} new tokens ({prompt_tokens:,} in all)"
        else:
            self.reading = f"reading {prompt_tokens:,} tokens"
        self._draw()

    def _draw(self) -> None:
        elapsed = "" if self.steady else f" ({time.monotonic() - self.started:.0f} s)"
        self.update(" · ".join(filter(None, [self.reading, f"waiting for {self.waiting_for}{elapsed}"])))
