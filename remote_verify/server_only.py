"""Streamed generation: the target makes the tokens and streams them to the client, pass by pass.

Each pass is its own work item on the device's queue, so a long generation takes turns
with other sessions' rounds instead of holding the device, and shares a forward pass with
them (and with other streams' passes) where the queue batches. A pass makes the target's
next token, after whatever of the client's pending guesses (Draft frames, taken by `handle`
while the stream runs: remote_verify/stream_drafts.py) it chose to verify and found right:
with no guesses this is the target alone, one token a pass (`--mode server`). The stream
never waits for a guess. It ends with a frame marked done: at a stop token, at max_tokens,
at a full context, on Cancel, or when the service drains for shutdown ("going_away": the
client goes on with another connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable

from websockets.exceptions import ConnectionClosed

from wire.protocol import Cancel, Draft, Error, Generate, Generated, encode
from remote_verify.pass_costs import PassCosts
from remote_verify.scheduler import QueueClosed
from remote_verify.session import Session, SessionError, StreamStep
from remote_verify.stream_drafts import StreamDrafts

log = logging.getLogger(__name__)

RunOnDevice = Callable[[Callable], Awaitable]  # runs a function on the device's worker
Send = Callable[[Generated], Awaitable[None]]


async def stream_generation(session: Session, request: Generate, run: RunOnDevice, send: Send,
                            cancelled: asyncio.Event, why_cancelled: Callable[[], str] = lambda: "cancelled",
                            on_step: Callable[[StreamStep, float], None] | None = None,
                            drafts: StreamDrafts | None = None, costs: PassCosts | None = None) -> None:
    """Serve one Generate (already accepted by `session.start_generation`).

    `why_cancelled()` names the stop once `cancelled` is set: "cancelled" (the client's
    Cancel) or "going_away" (the service is shutting down: the client continues elsewhere).
    `drafts`: the client's guesses as they arrive (None: the target alone).
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
        step = await run(session.stream_work(drafts, stop_ids, request.max_tokens - made, costs))  # may share a pass
        made += len(step.tokens)
        queue_s = max(0.0, step.started - queued)
        if on_step is not None:
            on_step(step, queue_s)
        stop = step.tokens[-1] in stop_ids
        done = stop or made >= request.max_tokens
        await send(Generated(seq=request.seq, tokens=step.tokens, committed_len=len(session.committed),
                             done=done, stop_reason=("eos" if stop else "max_tokens") if done else "",
                             forward_s=step.forward_s, queue_s=queue_s, accepted=step.accepted,
                             drafted=step.drafted, pass_tokens=step.pass_tokens, pass_sessions=step.pass_sessions))
        if done:
            return
    await send(Generated(seq=request.seq, tokens=[], committed_len=len(session.committed), done=True,
                         stop_reason=reason))


class ServerOnlyStream:
    """A connection's server-only generation: at most one at a time, cancellable."""

    def __init__(self, session: Session, run: RunOnDevice, ws, metrics=None,
                 on_send: Callable[[], None] = lambda: None, costs: PassCosts | None = None):
        self.session = session
        self.run = run
        self.ws = ws
        self.metrics = metrics
        self.on_send = on_send  # each frame sent (the idle timeout counts them)
        self.costs = costs  # the device's cost curve: prices the client's guesses
        self.drafts: StreamDrafts | None = None  # the running stream's guesses
        self._task: asyncio.Task | None = None
        self._cancelled = asyncio.Event()
        self._why = "cancelled"
        self._seq = 0

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def handle(self, message: Generate | Draft | Cancel) -> Error | None:
        """Start a stream, take the client's guesses for it, or cancel it; returns an Error to send, or None."""
        if isinstance(message, Cancel):
            if self.busy and message.seq == self._seq:
                self._cancelled.set()
            return None  # a Cancel that crossed the stream's last frame needs no answer
        if isinstance(message, Draft):
            return self._take_draft(message)
        if self.busy:
            return Error("busy", "a server-only generation is already streaming: cancel it first", seq=message.seq)
        try:
            await self.run(lambda: self.session.start_generation(message))
        except SessionError as exc:
            return Error(exc.code, exc.message, seq=message.seq, fatal=exc.fatal)
        self._seq = message.seq
        self.drafts = StreamDrafts(message.seq)
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

    def _take_draft(self, draft: Draft) -> Error | None:
        if not self.busy or self.drafts is None or draft.seq != self._seq:
            return None  # guesses that crossed the stream's last frame: nothing left to verify
        try:
            self.session.check_tokens(draft.tokens, "draft tokens")
        except SessionError as exc:
            return Error(exc.code, exc.message, seq=draft.seq)
        if draft.start < 0:
            return Error("bad_request", f"a draft starts at position {draft.start}: positions start at 0",
                         seq=draft.seq)
        problem = self.drafts.receive(draft)
        return Error("bad_request", problem, seq=draft.seq) if problem else None

    def stop(self) -> None:
        """The connection is gone: drop the stream without a last frame."""
        if self._task is not None:
            self._task.cancel()

    async def _serve(self, request: Generate, cancelled: asyncio.Event) -> None:
        async def send(frame: Generated) -> None:
            await self.ws.send(encode(frame))
            self.on_send()

        on_step = self.metrics.record_stream_pass if self.metrics is not None else None
        try:
            await stream_generation(self.session, request, self.run, send, cancelled, lambda: self._why, on_step,
                                    self.drafts, self.costs)
        except (ConnectionClosed, QueueClosed):  # the client left, or the service is stopping
            pass
        except Exception:  # a backend failure ends this stream, not the service
            log.exception("session %s: server-only generation failed", self.session.id)
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(encode(Error("internal", "the service failed while generating; reconnect "
                                                            "and Sync", seq=request.seq, fatal=True)))
