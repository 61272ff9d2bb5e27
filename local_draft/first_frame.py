"""A reply's first frame, watched while the drafter works, so that it never waits for a drafter's step.

Before a reply's first token the default mode's drafter (local_draft/stream_speculator.py) reads the
prompt and grows the first guesses a step at a time: a tree's level takes about 4 ms on a laptop GPU,
a guess about 32 ms on a laptop CPU (benchmarks/emulation/profiles/). The loop looked at the socket
between steps, so the first frame waited for the step under way, half a step at the median, on every
reply's first token. While the first frame is awaited, each step runs on a thread of its own and a
second thread waits on the socket; whichever ends first wakes the loop. A frame first: the loop
handles it at once, and the step, which goes on to its end (a decode cannot be stopped midway), is
waited for and its guesses dropped before the drafter is used again: they were for the text before
the frame (and a tree's level costs what it costs whether kept or not).

After the first frame the loop works as it always did: a step's guesses made while a frame arrives
are kept by that frame when it confirms them, which is worth more than the frame's few ms then.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable, TypeVar

T = TypeVar("T")

WATCH_S = 0.5  # one wait on the socket (a first frame later than this is watched anew): what a stop waits at most


class FrameFirst(Exception):
    """The first frame came while the drafter was mid-step: handle the frame; the step is dropped."""


class FirstFrameWatch:
    """One reply's wait for its first frame, on `pool`'s threads (two: the socket's and the drafter's)."""

    def __init__(self, client, pool: ThreadPoolExecutor) -> None:
        self._client = client
        self._pool = pool
        self._watch = pool.submit(client.wait_ready, WATCH_S)
        self._pending: Future | None = None  # a step the frame overtook, still running

    @property
    def waiting(self) -> bool:
        """Whether the socket is being watched (then nothing else may read it). A watch that ended
        without a frame (WATCH_S passed) is started anew."""
        if self._watch.done() and not self.came():
            self._watch = self._pool.submit(self._client.wait_ready, WATCH_S)
        return not self._watch.done()

    def came(self) -> bool:
        """Whether the frame has come (or the connection ended: the next receive says how)."""
        return self._watch.done() and (self._watch.exception() is not None or self._watch.result() is True)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the frame, watching anew as needed; whether it came."""
        deadline = time.monotonic() + timeout_s
        while self.waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wait((self._watch,), timeout=left)
        return True

    def finish(self) -> None:
        """Wait for the watch under way to end, frame or not, and start no other: the caller then reads
        the socket itself (a long wait is the client's receive's, which asks a silent service for a ping)."""
        wait((self._watch,))

    def run(self, step: Callable[[], T]) -> T:
        """`step` (a draft model's call) on the drafter's thread: its result, or FrameFirst if the frame
        came before it ended."""
        self.settle()
        running = self._pool.submit(step)
        while True:
            done, _ = wait((running, self._watch), return_when=FIRST_COMPLETED)
            if running in done:
                return running.result()
            if not self.waiting:  # the frame (not a watch that ended without one: that one is started anew)
                self._pending = running
                raise FrameFirst

    def settle(self) -> None:
        """Let a step the frame overtook end (a draft model does one thing at a time); its result is dropped."""
        running, self._pending = self._pending, None
        if running is not None:
            with contextlib.suppress(Exception):
                running.result()

    def close(self) -> None:
        """The stream is over: no step runs on, and the socket is free (a watch under way ends within
        WATCH_S; a stream that ends has sent its frames)."""
        self.settle()
        self.finish()
