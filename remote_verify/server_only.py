"""Server-only generation: the target alone, streamed to the client one token at a time.

Each token is its own work item on the device's queue, so a long generation takes turns
with other sessions' rounds instead of holding the device, and shares a forward pass with
them (and with other streams' tokens) where the queue batches. The stream ends with a frame
marked done: at a stop token, at max_tokens, at a full context, on Cancel, or when the
service drains for shutdown ("going_away": the client goes on with another connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable

from websockets.exceptions import ConnectionClosed

from wire.protocol import Cancel, Error, Generate, Generated, encode
from remote_verify.scheduler import QueueClosed
from remote_verify.session import Session, SessionError

log = logging.getLogger(__name__)

RunOnDevice = Callable[[Callable], Awaitable]  # runs a function on the device's worker
Send = Callable[[Generated], Awaitable[None]]


async def stream_generation(session: Session, request: Generate, run: RunOnDevice, send: Send,
                            cancelled: asyncio.Event, why_cancelled: Callable[[], str] = lambda: "cancelled",
                            on_token: Callable[[float, float], None] | None = None) -> None:
    """Serve one Generate (already accepted by `session.start_generation`).

    `why_cancelled()` names the stop once `cancelled` is set: "cancelled" (the client's
    Cancel) or "going_away" (the service is shutting down: the client continues elsewhere).
    """
    made = 0
    reason = "max_tokens"
    stop_ids = frozenset(request.stop_ids)  # looked up once per token: a set, whatever the client repeated
    while made < request.max_tokens:
        if cancelled.is_set():
            reason = why_cancelled()
            break
        if len(session.committed) + 1 > session.limits.max_context:
            reason = "context"
            break
        queued = time.perf_counter()
        token, started, forward_s = await run(session.next_token_work())  # may share a pass
        made += 1
        if on_token is not None:
            on_token(forward_s, max(0.0, started - queued))
        stop = token in stop_ids
        done = stop or made == request.max_tokens
        await send(Generated(seq=request.seq, tokens=[token], committed_len=len(session.committed),
                             done=done, stop_reason=("eos" if stop else "max_tokens") if done else "",
                             forward_s=forward_s, queue_s=max(0.0, started - queued)))
        if done:
            return
    await send(Generated(seq=request.seq, tokens=[], committed_len=len(session.committed), done=True,
                         stop_reason=reason))


class ServerOnlyStream:
    """A connection's server-only generation: at most one at a time, cancellable."""

    def __init__(self, session: Session, run: RunOnDevice, ws, metrics=None,
                 on_send: Callable[[], None] = lambda: None):
        self.session = session
        self.run = run
        self.ws = ws
        self.metrics = metrics
        self.on_send = on_send  # each frame sent (the idle timeout counts them)
        self._task: asyncio.Task | None = None
        self._cancelled = asyncio.Event()
        self._why = "cancelled"
        self._seq = 0

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def handle(self, message: Generate | Cancel) -> Error | None:
        """Start or cancel a stream; returns an Error to send, or None."""
        if isinstance(message, Cancel):
            if self.busy and message.seq == self._seq:
                self._cancelled.set()
            return None  # a Cancel that crossed the stream's last frame needs no answer
        if self.busy:
            return Error("busy", "a server-only generation is already streaming: cancel it first", seq=message.seq)
        try:
            await self.run(lambda: self.session.start_generation(message))
        except SessionError as exc:
            return Error(exc.code, exc.message, seq=message.seq, fatal=exc.fatal)
        self._seq = message.seq
        self._cancelled = asyncio.Event()
        self._why = "cancelled"
        self._task = asyncio.create_task(self._serve(message, self._cancelled))
        return None

    async def finish(self, reason: str) -> None:
        """End the stream after the token being made, with a last frame saying `reason`."""
        if self.busy:
            self._why = reason
            self._cancelled.set()
            with contextlib.suppress(Exception):
                await self._task

    def stop(self) -> None:
        """The connection is gone: drop the stream without a last frame."""
        if self._task is not None:
            self._task.cancel()

    async def _serve(self, request: Generate, cancelled: asyncio.Event) -> None:
        async def send(frame: Generated) -> None:
            await self.ws.send(encode(frame))
            self.on_send()

        on_token = self.metrics.record_streamed_token if self.metrics is not None else None
        try:
            await stream_generation(self.session, request, self.run, send, cancelled, lambda: self._why, on_token)
        except (ConnectionClosed, QueueClosed):  # the client left, or the service is stopping
            pass
        except Exception:  # a backend failure ends this stream, not the service
            log.exception("session %s: server-only generation failed", self.session.id)
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(encode(Error("internal", "the service failed while generating; reconnect "
                                                            "and Sync", seq=request.seq, fatal=True)))
