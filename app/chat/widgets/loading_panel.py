"""What the chat shows while it starts: the current step, the service's last words, the time."""

from __future__ import annotations

import re
import time

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Static

LOG_PREFIX = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")  # serve's log format


class LoadingPanel(Vertical):
    def __init__(self, steady: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.steady = steady
        self.started = time.monotonic()
        self.step = "starting"
        self.stopped_at: float | None = None  # the clock is stopped (a dialog says what went wrong)

    def compose(self) -> ComposeResult:
        yield Label("Starting", classes="role")
        yield Static("", id="loading-step", markup=False)
        yield Static("", id="loading-detail", markup=False)

    def on_mount(self) -> None:
        self._draw()
        if not self.steady:
            self.set_interval(0.5, self._draw)

    def stop_clock(self) -> None:
        """Nothing is being waited for now: the seconds stop where they are."""
        self.stopped_at = time.monotonic()
        self._draw()

    def restart_clock(self, step: str) -> None:
        """A new attempt: its own seconds, from zero."""
        self.started, self.stopped_at = time.monotonic(), None
        self.show(step)

    def show(self, text: str, from_service: bool = False) -> None:
        """A startup step, or a line the service logged (shown under the step)."""
        if from_service:
            self.query_one("#loading-detail", Static).update("  service: " + LOG_PREFIX.sub("", text))
        else:
            self.step = text
            self.query_one("#loading-detail", Static).update("")
        self._draw()

    def _draw(self) -> None:
        now = self.stopped_at if self.stopped_at is not None else time.monotonic()
        elapsed = "" if self.steady else f" ({now - self.started:.0f} s)"
        self.query_one("#loading-step", Static).update(f"{self.step} ...{elapsed}")
