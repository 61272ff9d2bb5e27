"""When a connection counts as idle: neither side has sent a frame for the idle timeout.

A server-only stream sends for as long as the target generates while its client, waiting,
sends nothing; the stream's frames keep the connection alive as much as the client's do.
"""

from __future__ import annotations

import time


class IdleClock:
    def __init__(self, timeout_s: float, clock=time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self._last = clock()

    def touch(self) -> None:
        """A frame went one way or the other."""
        self._last = self._clock()

    def remaining_s(self) -> float:
        """Seconds until the connection is idle (0 once it is)."""
        return max(0.0, self._last + self.timeout_s - self._clock())
