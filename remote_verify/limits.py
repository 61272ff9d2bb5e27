"""The token bucket that enforces a request rate per connection (the limits themselves: wire/limits.py)."""

from __future__ import annotations

import time


class TokenBucket:
    """`rate` tokens a second up to `burst`; a request takes one or is told how long to wait."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, cost: int = 1) -> float:
        """Take `cost` tokens (at most the burst): 0.0 if there were as many, else the seconds
        until there will be."""
        cost = min(cost, self.burst)
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= cost:
            self._tokens -= cost
            return 0.0
        return (cost - self._tokens) / self.rate
