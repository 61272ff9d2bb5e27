"""One request on a thread of its own, its events handed to the event loop.

The engine blocks (tokenizing, llama.cpp, a synchronous WebSocket), so each request runs
on a thread: first its prompt is made ready (Accepted, or Failed with the 4xx to answer),
then it generates; events go to an asyncio queue through `call_soon_threadsafe`. `stop()`
asks the generation to end: it does within a round, and its session with the service
closes (a client that went away cancels the work it asked for).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import AsyncIterator

from app.api.engine import ApiEngine
from app.api.events import Accepted, Delta, Failed, Finished
from app.api.errors import ApiError
from app.api.request_body import CompletionRequest

log = logging.getLogger(__name__)


class ReplyRun:
    def __init__(self, engine: ApiEngine, request: CompletionRequest):
        self._engine = engine
        self._request = request
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        self._ended = False  # the last event (Finished or Failed) was emitted
        self._received_at = time.perf_counter()
        self.thread = threading.Thread(target=self._work, name="specwire-api-request", daemon=True)

    def start(self) -> ReplyRun:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    async def accepted(self) -> Failed | None:
        """Wait until the request is made ready: None, or the refusal to answer with."""
        event = await self._events.get()
        return event if isinstance(event, Failed) else None

    async def events(self) -> AsyncIterator[Delta | Finished | Failed]:
        """The generation's events as they come, up to and with the last (Finished or Failed)."""
        while True:
            event = await self._events.get()
            yield event
            if not isinstance(event, Delta):
                return

    def _work(self) -> None:
        try:
            job = self._engine.prepare(self._request, self._received_at)
            self._emit(Accepted())
            self._engine.run(job, self._emit, self._stop.is_set)
        except ApiError as exc:
            self._emit(Failed(exc))
        except Exception as exc:  # a bug must not leave the client waiting: it hears a 500
            log.exception("a request failed")
            self._emit(Failed(ApiError(500, f"the request failed: {exc!r} (details in the log)",
                                       code="internal_error", kind="server_error")))
        finally:
            if not self._ended:  # stopped before its end: whoever still waits must not wait forever
                self._emit(Failed(ApiError(499, "the request was cancelled", code="cancelled")))

    def _emit(self, event: Accepted | Delta | Finished | Failed) -> None:
        self._ended = self._ended or isinstance(event, (Finished, Failed))
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self._stop.set()
