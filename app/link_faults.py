"""The faults of a user's link, for `specwire proxy`: jitter, stalls, drops and a bandwidth cap.

One `LinkFaults` says what a link suffers; each connection through the proxy draws its own
schedule of stalls and drops from a generator seeded by the proxy's seed and the connection's
number, so a run repeats whatever order other connections arrive in. Times are exponential
around the mean interval given (faults at random times, as on a real link).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkFaults:
    rtt_ms: float = 0.0  # round-trip time added (half each way)
    jitter_ms: float = 0.0  # +- spread of that time; bytes are delayed, never reordered
    stall_every_s: float = 0.0  # mean interval between stalls (0: none)
    stall_s: float = 0.0  # how long a stall holds every byte, both ways, without closing
    disconnect_every_s: float = 0.0  # mean interval between drops of a connection (0: none)
    bandwidth_kbps: float = 0.0  # each direction's cap in kilobits a second (0: none)

    def problems(self) -> list[str]:
        """What is wrong with these settings, each saying which flag (empty: nothing)."""
        named = {"--rtt-ms": self.rtt_ms, "--jitter-ms": self.jitter_ms, "--stall-every": self.stall_every_s,
                 "--stall-s": self.stall_s, "--disconnect-every": self.disconnect_every_s,
                 "--bandwidth-kbps": self.bandwidth_kbps}
        problems = [f"{flag} cannot be negative (got {value:g})" for flag, value in named.items() if value < 0]
        if self.stall_every_s > 0 and self.stall_s <= 0:
            problems.append("--stall-every needs --stall-s (how long each stall lasts)")
        return problems

    def describe(self) -> str:
        parts = [f"{self.rtt_ms:g} ms round trip (jitter {self.jitter_ms:g} ms)"]
        if self.stall_every_s > 0:
            parts.append(f"a {self.stall_s:g} s stall every {self.stall_every_s:g} s on average")
        if self.disconnect_every_s > 0:
            parts.append(f"a drop every {self.disconnect_every_s:g} s on average")
        if self.bandwidth_kbps > 0:
            parts.append(f"{self.bandwidth_kbps:g} kbit/s each way")
        return ", ".join(parts)


class ConnectionFaults:
    """One connection's draws: its one-way delays and when it next stalls or drops."""

    def __init__(self, faults: LinkFaults, seed: int | None, number: int):
        self.faults = faults
        # a string seed is hashed stably (unlike a tuple): the same seed and number, the same schedule
        self._random = random.Random(f"{seed}:{number}") if seed is not None else random.Random()

    def one_way_s(self) -> float:
        """Half the round trip, plus or minus up to half the jitter, never negative."""
        jitter = self._random.uniform(-self.faults.jitter_ms, self.faults.jitter_ms) / 2
        return max(0.0, (self.faults.rtt_ms / 2 + jitter) / 1000)

    def transfer_s(self, n_bytes: int) -> float:
        """How long n_bytes take on the wire under the bandwidth cap (0 without one)."""
        if self.faults.bandwidth_kbps <= 0:
            return 0.0
        return n_bytes * 8 / (self.faults.bandwidth_kbps * 1000)

    def next_stall_in_s(self) -> float | None:
        every = self.faults.stall_every_s
        return self._random.expovariate(1 / every) if every > 0 else None

    def next_drop_in_s(self) -> float | None:
        every = self.faults.disconnect_every_s
        return self._random.expovariate(1 / every) if every > 0 else None
