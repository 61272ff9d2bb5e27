"""One device's model work: a single worker thread that serves sessions in turn.

Every forward pass (and every cache allocation or release) of every session goes through
the device's queue, so the model is only ever touched from one thread and the event loop
never blocks on it. Sessions take turns, round-robin: a session with many items waiting
(a long stream of per-token work) gets one item run, then goes to the back of the line
behind every other session that is waiting, so no session is starved by a busy neighbour.

Batching several sessions' blocks into one forward pass is not done: llama.cpp keeps one
context per session, and on a CPU a batched pass costs about the sum of its parts; the
queue is what keeps latency fair and measurable.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

log = logging.getLogger(__name__)


@dataclass
class _Item:
    work: Callable[[], Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.perf_counter)


class QueueClosed(RuntimeError):
    """The device queue was shut down; no more work is taken."""


class DeviceQueue:
    def __init__(self, name: str = "target"):
        self.name = name
        self._ready = threading.Condition()
        self._waiting: dict[Hashable, deque[_Item]] = {}  # per session, in arrival order
        self._turns: deque[Hashable] = deque()  # sessions with work, in the order they are served
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"{name}-worker", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Items waiting (not counting the one running)."""
        with self._ready:
            return sum(len(items) for items in self._waiting.values())

    async def run(self, session: Hashable, work: Callable[[], Any],
                  arrived: float | None = None) -> tuple[Any, float]:
        """Run `work()` on the device thread in `session`'s turn; returns (its result, seconds queued).

        `arrived` (time.perf_counter) is when the request reached the service; queueing is
        counted from then. An exception raised by `work` is raised here.
        """
        loop = asyncio.get_running_loop()
        item = _Item(work, loop.create_future(), loop)
        if arrived is not None:
            item.arrived = arrived
        with self._ready:
            if self._closed:
                raise QueueClosed(f"the {self.name} queue is shut down")
            items = self._waiting.get(session)
            if items is None:
                items = self._waiting[session] = deque()
                self._turns.append(session)
            items.append(item)
            self._ready.notify()
        try:
            return await item.future
        finally:
            # An exception raised here keeps this frame in its traceback, and the future holds
            # the exception: without this `del` the frame leads back to the future through
            # `item`, a cycle that keeps the request alive until a full garbage collection.
            del item

    def shutdown(self, wait: bool = True) -> None:
        """Take no more work; the worker finishes the items already queued, then stops.

        With wait=False the caller does not wait for that (a model still loading at exit:
        the worker is a daemon thread and ends with the process).
        """
        with self._ready:
            self._closed = True
            self._ready.notify()
        if wait:
            self._thread.join()

    def _next(self) -> _Item | None:
        with self._ready:
            while not self._turns:
                if self._closed:
                    return None
                self._ready.wait()
            session = self._turns.popleft()
            items = self._waiting[session]
            item = items.popleft()
            if items:
                self._turns.append(session)  # its next item waits behind everyone else's
            else:
                del self._waiting[session]
            return item

    def _serve(self) -> None:
        while (item := self._next()) is not None:
            started = time.perf_counter()
            try:
                result, error = item.work(), None
            except BaseException as exc:  # handed to the awaiting coroutine, raised there
                result, error = None, exc
            try:
                item.loop.call_soon_threadsafe(_settle, item.future, result, error, started - item.arrived)
            except RuntimeError:  # the event loop has already closed: nobody is waiting
                log.debug("dropped a result for a closed event loop")
            # The same on this side: an exception's traceback holds this frame, whose locals
            # would hold the exception and the item (its request) until the next item came.
            del item, result, error


def _settle(future: asyncio.Future, result: Any, error: BaseException | None, queued_s: float) -> None:
    if future.cancelled():  # the connection went away while its item ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result((result, queued_s))
