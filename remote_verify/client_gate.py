"""Admission per client: how fast one client may open sessions, and how many it may hold.

A client is an address (behind a proxy, every client has the proxy's: raise the limits, or
set --max-sessions-per-client to --max-sessions). A client holding the shared token could
otherwise open and close sessions as fast as it liked (each a handshake and a KV slot: the
churn that grows and shrinks pools) or take every session of the service. Clients on this
machine (loopback) are not limited per client unless `limit_loopback`: they are the service's
own programs (the chat, benchmarks, tests), and another local user cannot reach an embedded
service that has a token.
"""

from __future__ import annotations

import ipaddress
import time

from remote_verify.limits import TokenBucket
from wire.limits import ServiceLimits

FORGET_S = 600.0  # a client quiet this long has its handshake budget refilled (its entry dropped)


class ClientGate:
    def __init__(self, limits: ServiceLimits):
        self.limits = limits
        self._buckets: dict[str, TokenBucket] = {}
        self._last: dict[str, float] = {}

    @property
    def per_client(self) -> int:
        """Sessions one client may hold: the flag, or half the service's (at least 1)."""
        return self.limits.max_sessions_per_client or max(1, self.limits.max_sessions // 2)

    def refusal(self, address: str, holding: int) -> tuple[str, float] | None:
        """(why, seconds to wait) when `address`, holding `holding` sessions, may not open another now."""
        if not self.limits.limit_loopback and _loopback(address):
            return None
        if holding >= self.per_client:
            return (f"this client ({address}) holds {holding} sessions, the most one client may "
                    f"(--max-sessions-per-client {self.per_client}): close one first", self.limits.retry_after_s)
        now = time.monotonic()
        self._forget(now)
        bucket = self._buckets.get(address)
        if bucket is None:
            bucket = self._buckets[address] = TokenBucket(self.limits.handshake_rate_per_s, self.limits.handshake_burst)
        self._last[address] = now
        wait_s = bucket.take()
        if wait_s > 0:
            return (f"more than {self.limits.handshake_rate_per_s:g} new sessions a second from this client "
                    f"({address}; --handshake-rate, burst {self.limits.handshake_burst})", wait_s)
        return None

    def _forget(self, now: float) -> None:
        if len(self._last) > 1024:
            for address, last in list(self._last.items()):
                if now - last > FORGET_S:
                    del self._last[address], self._buckets[address]


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False
