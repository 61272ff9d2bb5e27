"""One request's generation on a thread of its own, its events handed to the event loop.

The engine blocks (llama.cpp, a synchronous WebSocket), so each request runs it on a
thread, which puts the events on an asyncio queue through `call_soon_threadsafe`. `stop()`
asks the generation to end: it does within a round, and its session with the service
closes (a client that went away cancels the work it asked for).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import AsyncIterator

from app.api.engine import ApiEngine, Delta, Failed, Finished, Job
from app.api.errors import ApiError

log = logging.getLogger(__name__)


class ReplyRun:
    def __init__(self, engine: ApiEngine, job: Job):
        self._engine = engine
        self._job = job
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        self._ended = False  # the last event (Finished or Failed) was emitted
        self.thread = threading.Thread(target=self._work, name="specwire-api-request", daemon=True)

    def start(self) -> ReplyRun:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    async def events(self) -> AsyncIterator[Delta | Finished | Failed]:
        """The events as they come, up to and with the last (Finished or Failed)."""
        while True:
            event = await self._events.get()
            yield event
            if not isinstance(event, Delta):
                return

    def _work(self) -> None:
        self._engine.run(self._job, self._emit, self._stop.is_set)
        if not self._ended:  # stopped before its end: whoever still waits must not wait forever
            self._emit(Failed(ApiError(499, "the request was cancelled", code="cancelled")))

    def _emit(self, event: Delta | Finished | Failed) -> None:
        self._ended = self._ended or not isinstance(event, Delta)
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self._stop.set()
