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
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

from websockets.exceptions import ConnectionClosed

from wire.draft_tree import tree_problem
from wire.protocol import Cancel, Draft, Error, Generate, Generated, encode
from remote_verify.pass_costs import PassCosts
from remote_verify.scheduler import Bookkeeping, DeviceQueue, Planned, QueueClosed, Shareable
from remote_verify.session import Session, SessionError, StreamStep
from remote_verify.stream_drafts import StreamDrafts

log = logging.getLogger(__name__)

Send = Callable[[Generated], Awaitable[None]]


@dataclass
class Streamed:
    """One pass of a stream, finished on the device thread: what it made, and whether the stream ends."""

    step: StreamStep
    committed_len: int
    reason: str = ""  # why the stream ends after this pass ("eos", "max_tokens", "context", a cancel's), or ""


async def stream_generation(session: Session, request: Generate, queue: DeviceQueue, send: Send,
                            cancelled: asyncio.Event, why_cancelled: Callable[[], str] = lambda: "cancelled",
                            on_step: Callable[[StreamStep, float], None] | None = None,
                            drafts: StreamDrafts | None = None, costs: PassCosts | None = None,
                            started: asyncio.Future | None = None) -> None:
    """Serve one Generate.

    The passes run back to back on the device (`DeviceQueue.stream`: each pass's successor is
    queued as it finishes, on the device thread); this coroutine sends their frames as they
    come. `why_cancelled()` names the stop once `cancelled` is set: "cancelled" (the client's
    Cancel) or "going_away" (the service is shutting down: the client continues elsewhere).
    `drafts`: the client's guesses as they arrive (None: the target alone).

    With `started`, the Generate is accepted here, as the stream's first item
    (`session.start_generation`, bookkeeping: it goes before the passes in line), and `started`
    gets its outcome: None, or the SessionError that refused it (the stream then ends, with no
    frame). The first pass is queued on the device thread as the start finishes: accepted by a
    turn of its own and its pass queued from the event loop, a new reply's first token waited for
    the pass formed meanwhile too (the emulated 1.5B at 64 users: the loop, busy with every
    stream's frames, let one or two such passes go by). Without it, the caller accepted it.
    """
    stop_ids = frozenset(request.stop_ids)  # looked up once per token: a set, whatever the client repeated
    made = 0

    def ends(last: int | None) -> str:
        """Why the stream ends before another pass ("" if it goes on); on the device thread."""
        if last is not None and last in stop_ids:
            return "eos"
        if made >= request.max_tokens:
            return "max_tokens"
        if cancelled.is_set():  # set on the event loop, read here: a pass late at most
            return why_cancelled()
        if len(session.committed) + 1 > session.limits.max_context:
            return "context"
        return ""

    def next_pass() -> Shareable:
        """The stream's next pass, whose result says what it made and whether the stream ends."""
        inner = session.stream_work(drafts, stop_ids, request.max_tokens - made, costs)

        def plan(so_far) -> Planned:
            planned = inner.plan(so_far)

            def finish(result, forward_s: float) -> Streamed:
                nonlocal made
                step = planned.finish(result, forward_s)
                made += len(step.tokens)
                return Streamed(step, len(session.committed), ends(step.tokens[-1]))

            return replace(planned, finish=finish)

        outer = Shareable(inner.backend, plan, inner.tokens, starting=inner.starting)

        def split(limit: int):
            """A long prompt's prefill in pieces, each a turn of its own beside the other sessions'
            passes (without this, a new reply's whole prompt ran in one pass and every other stream
            waited for it); the pass itself, counted here, runs after the last piece."""
            parts = inner.split(limit)
            return None if parts is None else (parts[0], outer)

        outer.split = split
        return outer

    nothing_to_make = ""  # why the stream ended at its start, as its first pass would have been queued

    def follow(streamed: Streamed | None) -> Shareable | None:
        """The pass after `streamed` (None: the start just accepted), or None where the stream ends."""
        nonlocal nothing_to_make
        if streamed is None:
            nothing_to_make = ends(None)
            return None if nothing_to_make else next_pass()
        return None if streamed.reason else next_pass()

    if started is None and ends(None):
        await send(Generated(seq=request.seq, tokens=[], committed_len=len(session.committed), done=True,
                             stop_reason=ends(None)))
        return
    results: asyncio.Queue = asyncio.Queue()
    first = Bookkeeping(lambda: session.start_generation(request)) if started is not None else next_pass()
    queue.stream(session.id, first, follow, lambda result, error, queued_s: results.put_nowait((result, error, queued_s)))
    while True:
        streamed, error, queued_s = await results.get()
        if started is not None and not started.done() and (error is None or isinstance(error, SessionError)):
            started.set_result(error)  # the start's outcome (any other error is the caller's: raised below)
            if error is not None:
                return
            if nothing_to_make:  # max_tokens 0, a full context: no pass was queued
                await send(Generated(seq=request.seq, tokens=[], committed_len=len(session.committed),
                                     done=True, stop_reason=nothing_to_make))
                return
            continue
        if error is not None:
            raise error
        step = streamed.step
        if on_step is not None:
            on_step(step, queued_s)
        await send(Generated(seq=request.seq, tokens=step.tokens, committed_len=streamed.committed_len,
                             done=bool(streamed.reason), stop_reason=streamed.reason, forward_s=step.forward_s,
                             queue_s=queued_s, accepted=step.accepted, drafted=step.drafted,
                             pass_tokens=step.pass_tokens, pass_sessions=step.pass_sessions,
                             logprobs=step.logprobs))
        if streamed.reason:
            return


class ServerOnlyStream:
    """A connection's server-only generation: at most one at a time, cancellable."""

    def __init__(self, session: Session, queue: DeviceQueue, ws, metrics=None,
                 on_send: Callable[[], None] = lambda: None, costs: PassCosts | None = None):
        self.session = session
        self.queue = queue
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
        self._seq = message.seq
        self.drafts = StreamDrafts(message.seq)
        self._cancelled = asyncio.Event()
        self._why = "cancelled"
        started = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(message, self._cancelled, started))
        refused = await asyncio.shield(started)  # the start runs as the stream's first item (stream_generation)
        if refused is not None:
            return Error(refused.code, refused.message, seq=message.seq, fatal=refused.fatal)
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
        problem = tree_problem(draft.parents, len(draft.tokens))
        if problem:
            return Error("bad_tree", problem, seq=draft.seq)
        problem = self.drafts.receive(draft)
        return Error("bad_request", problem, seq=draft.seq) if problem else None

    def stop(self) -> None:
        """The connection is gone: drop the stream without a last frame (the device stops after
        the pass it may be running: its successor sees the stream cancelled)."""
        self._why = "lost"
        self._cancelled.set()
        if self._task is not None:
            self._task.cancel()

    async def _serve(self, request: Generate, cancelled: asyncio.Event, started: asyncio.Future) -> None:
        async def send(frame: Generated) -> None:
            await self.ws.send(encode(frame))
            self.on_send()

        on_step = self.metrics.record_stream_pass if self.metrics is not None else None
        try:
            await stream_generation(self.session, request, self.queue, send, cancelled, lambda: self._why, on_step,
                                    self.drafts, self.costs, started)
        except ConnectionClosed:  # the client left
            pass
        except QueueClosed as closed:  # the service is stopping, or its queue failed
            if not started.done():  # before the start: `handle` raises it, as a refused start would be
                started.set_exception(closed)
        except Exception:  # a backend failure ends this stream, not the service
            log.exception("session %s: server-only generation failed", self.session.id)
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(encode(Error("internal", "the service failed while generating; reconnect "
                                                            "and Sync", seq=request.seq, fatal=True)))
        finally:
            if not started.done():  # ended before its start was answered (a closed queue, a lost link): no Error
                started.set_result(None)
