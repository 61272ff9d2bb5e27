"""A one-line progress bar on stderr: byte counts (downloads, checksums) or steps (benchmark runs)."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """Call with (done, total). Redraws in place on a terminal; prints every 10% in a log."""

    def __init__(self, label: str, width: int = 30, stream=sys.stderr, unit: str = "MB", scale: float = 1e6):
        self.label = label
        self.unit = unit  # what done and total count, after dividing by scale
        self.scale = scale
        self.width = width
        self.stream = stream
        self.started = time.monotonic()
        self._interactive = stream.isatty()
        self._last_draw = 0.0
        self._last_decile = -1

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        fraction = done / total if total else 1.0
        finished = done >= total
        decile = int(fraction * 10)
        if not finished:
            if self._interactive and now - self._last_draw < 0.1:
                return
            if not self._interactive and decile == self._last_decile:
                return
        self._last_draw, self._last_decile = now, decile
        filled = int(self.width * fraction)
        elapsed = max(now - self.started, 1e-6)
        if self.unit == "MB":
            rate = f"{done / elapsed / self.scale:,.0f} MB/s"
        else:  # steps of seconds or minutes each: the time left says more than a rate
            left = elapsed / done * (total - done) if done else float("nan")
            rate = f"{left / 60:,.1f} min left" if done else "..."
        line = (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {100 * fraction:5.1f}% "
                f"{done / self.scale:,.0f}/{total / self.scale:,.0f} {self.unit} {rate}")
        if self._interactive:
            self.stream.write("\r" + line + ("\n" if finished else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
