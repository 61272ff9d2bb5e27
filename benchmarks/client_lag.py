"""How late the load generator's own threads run: whether a wave measured the service or its clients.

Every emulated user is a real client, a few threads each, in a process that shares this machine's two
cores with the service; past a few hundred users one process could not keep up (the clients' ping watch cut
links whose pongs waited seconds for a turn at the interpreter). A slow client is slow in every figure it
reports: its first tokens, its drafts, its replies. So each process that runs users also runs a watch: a
thread that asks to sleep TICK_S over and over and keeps how late it woke. A thread of that process waits
about as long for its turn; over the time scale, that is emulated time the service never spent.
"""

from __future__ import annotations

import threading
import time

TICK_S = 0.005  # the watch's sleep: short beside every scaled duration it is read against


class ClientLag:
    """A thread that keeps how late each of its short sleeps woke (time.perf_counter, seconds)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (when it woke, how late)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="client-lag", daemon=True)

    def start(self) -> "ClientLag":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.is_set():
            asked = time.perf_counter()
            time.sleep(TICK_S)
            woke = time.perf_counter()
            self.samples.append((woke, max(0.0, woke - asked - TICK_S)))

    def within(self, start: float, end: float) -> list[float]:
        """How late it woke, each time between `start` and `end`."""
        return [late for woke, late in self.samples if start <= woke < end]
