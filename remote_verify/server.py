"""The verification service: a WebSocket server that runs sessions against one target.

Plain HTTP on the same port: `/healthz` (200 once the target is loaded, 503 while it
loads or drains, or once its device queue has failed) and `/metrics` (Prometheus; behind the bearer token when the service has
one, unless `public_metrics`). Auth and the admission limits are applied
in `process_request`, before the upgrade. Each connection is one session; its model work
goes through the device's queue (one worker thread, sessions in turn, their rounds sharing
forward passes), so the event loop keeps answering pings, health checks and other clients
while a forward pass runs.

SIGINT/SIGTERM drain: new sessions are refused, rounds in flight finish and are answered,
then every connection is closed with 1001 (going away) and the client reconnects, to this
service when it is back or to any other replica. A second signal stops without waiting.

Behind the same bearer token, plain HTTP also serves the target's vocabulary to clients
with no model file (`/vocab.json`, `/vocab.gguf`; made once, when the target is loaded:
vocab_offer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import signal
import ssl
import time
from dataclasses import dataclass
import functools
from functools import partial
from pathlib import Path
from typing import Callable

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from remote_verify.access import bearer_problem
from remote_verify.backends import device_owner
from remote_verify.backends.target import TargetBackend
from remote_verify.client_gate import ClientGate
from wire.service_proof import CHALLENGE_HEADER, MAX_CHALLENGE_CHARS, PROOF_HEADER, proof
from remote_verify.frames import BadFrame, FrameReader, frame_cost, hello_problems
from remote_verify.idle import IdleClock
from remote_verify.limits import TokenBucket
from remote_verify.pass_ledger import FIRST_TOKEN_ROOM, FIRST_TOKEN_ROOM_MS
from wire.grammar import KINDS as grammar_kinds, available as grammars_available
from wire.limits import ServiceLimits
from remote_verify.logs import printable, session_log
from remote_verify.memory import give_back_free_memory, kv_memory_problem
from remote_verify.metrics import ServiceMetrics
from remote_verify.pass_costs import costs_for
from remote_verify.pass_trace import PassTrace
from wire.protocol import (
    CLOSE_GOING_AWAY,
    CLOSE_IDLE_TIMEOUT,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_VOCAB_MISMATCH,
    SUBPROTOCOL,
    Cancel,
    Draft,
    Error,
    Generate,
    Hello,
    Sync,
    Verify,
    Welcome,
    encode,
    vocab_fingerprint,
)
from remote_verify.scheduler import BATCH_TOKENS, Bookkeeping, DeviceQueue, QueueClosed
from remote_verify.session import Session, SessionError, SessionLimits, grammar_vocab
from remote_verify.server_only import ServerOnlyStream
from remote_verify import vocab_offer
from remote_verify.vocab_offer import VocabOffer, make_vocab_offer, offer_response

log = logging.getLogger(__name__)

TargetLoader = Callable[[], TargetBackend]
# Frames read ahead per connection while one is answered: a client waits for each reply, so
# two are enough (a Cancel may cross a request), and each may be max_frame_bytes: this bounds
# what a connection that pipelines can make the service hold.
FRAMES_BUFFERED = 2
# How long a close (a drain's 1001, a refusal's) waits for the client's answer before the TCP
# connection is dropped: a live client answers at once, and websockets' default (10 s) made a drain
# wait that long for each client behind a stalled link (4 to 22 s in the soak).
CLOSE_TIMEOUT_S = 2.0
TIDY_EVERY_S = 5.0  # how often the backend may free or shrink KV pools its sessions have left


@dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None  # bearer token; None accepts every client (loopback use)
    tls: ssl.SSLContext | None = None  # serve wss:// with this context
    hello_timeout_s: float = 10.0  # a client must introduce itself promptly
    ping_interval_s: float = 20.0
    limits: SessionLimits = SessionLimits()  # per round: draft length, context
    service_limits: ServiceLimits = ServiceLimits()  # per service and connection
    batch_tokens: int = BATCH_TOKENS  # budget of a forward pass shared by sessions; 0: one session a pass
    public_metrics: bool = False  # /metrics without the token (a scraper inside the cluster); else behind it
    fair_passes: bool = True  # guesses fill a shared pass only as every member's ledger allows (pass_ledger.py)
    first_token_room: float = FIRST_TOKEN_ROOM  # how much more than the plain pass a pass making a first token may cost
    first_token_room_ms: float = FIRST_TOKEN_ROOM_MS  # ... and at most this many ms more
    device_nice: int = 0  # the device thread's niceness over the event loop's (remote_verify/device_priority.py)
    trace_passes: Path | None = None  # every shared pass written to this file (remote_verify/pass_trace.py)


class TargetLoadError(RuntimeError):
    """The target model could not be loaded; the service stopped without serving."""


class SettingsRefused(TargetLoadError):
    """The target loaded, but the service's settings cannot work with it (its KV memory does not fit)."""


class VerifyService:
    def __init__(self, backend: TargetBackend | TargetLoader, config: ServiceConfig):
        """`backend` is a loaded target, or a function that loads one once the port is open."""
        self.config = config
        self.guard = config.service_limits
        self._loader: TargetLoader = (lambda: backend) if hasattr(backend, "forward") else backend
        self.backend: TargetBackend | None = None
        self._claimed: TargetBackend | None = None  # the backend this service owns (device_owner.py), once loaded
        self.limits = config.limits  # capped by the model's own context once it is loaded
        self.frames = FrameReader(self.limits.max_context, self.limits.max_draft)  # rebuilt with the capped limits
        self.fingerprint = ""
        self.vocab = VocabOffer(reason="the target is still loading")  # made once the target is loaded
        self.state = "loading"  # then "ready", then "draining"
        self.port: int | None = None  # once listening
        self.metrics = ServiceMetrics()
        self.queue = DeviceQueue("target", config.batch_tokens, nice=config.device_nice)  # one per device
        self.queue.fair = config.fair_passes
        self.queue.ledger.first_token_room = config.first_token_room
        self.queue.ledger.first_token_room_s = config.first_token_room_ms / 1000
        if config.trace_passes is not None:
            self.queue.trace = PassTrace(config.trace_passes)
        self.metrics.queue_depth.set_function(lambda: self.queue.depth)
        self.metrics.target_passes.set_function(lambda: self.queue.passes)
        self.metrics.pass_members.set_function(lambda: self.queue.shared_items)
        self.metrics.plain_streams.set_function(lambda: self.queue.plain_streams)
        self.metrics.micro_batches.set_function(lambda: getattr(self.backend, "ubatches", 0))
        self.metrics.padding_tokens.set_function(lambda: getattr(self.backend, "padded_tokens", 0))
        self.metrics.kv_slots.set_function(lambda: getattr(self.backend, "kv_slots", 0))
        self.metrics.busy_seconds.set_function(lambda: self.queue.busy_s)
        self.sessions: dict[str, Session] = {}
        self._connections: dict[str, ServerConnection] = {}
        self._busy: set[str] = set()  # sessions with a round in flight
        self._streams: dict[str, ServerOnlyStream] = {}  # each session's server-only generation
        self._admitted: set[ServerConnection] = set()  # upgrades let through, not closed yet
        self._gate = ClientGate(self.guard)  # handshakes a second and sessions held, per client
        self._allocating: set[asyncio.Task] = set()  # sessions' caches being allocated ahead (held: not collected)

    # ---- lifecycle --------------------------------------------------------------------

    async def run(self, on_ready: Callable[[str], None], handle_signals: bool = True) -> None:
        """Serve until SIGINT/SIGTERM or stop(); `on_ready(url)` is called once sessions are taken."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopping = loop.create_future()
        self._hurry = asyncio.Event()
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._request_stop)
        try:
            async with serve(
                self._handle,
                self.config.host,
                self.config.port,
                subprotocols=[SUBPROTOCOL],
                process_request=self._process_request,
                process_response=self._process_response,
                max_size=self.guard.max_frame_bytes,
                max_queue=FRAMES_BUFFERED,
                ping_interval=self.config.ping_interval_s,
                close_timeout=CLOSE_TIMEOUT_S,
                ssl=self.config.tls,
            ) as server:
                self.port = server.sockets[0].getsockname()[1]  # open: /healthz answers while loading
                if not await self._load_target():
                    return
                self.state = "ready"
                self.metrics.ready.set(1)
                tidying = asyncio.ensure_future(self._tidy_every(TIDY_EVERY_S))
                on_ready(self._url(self.port))
                await self._stopping
                tidying.cancel()
                await self._drain()
        finally:
            # stopped while loading: do not wait minutes for a model nobody will use
            await loop.run_in_executor(None, partial(self.queue.shutdown, wait=self.state != "loading"))
            if self.queue.trace is not None and self.state != "loading":  # its worker has ended: nothing writes
                self.queue.trace.close()
            if self._claimed is not None:  # its device thread has ended: another service may serve it
                device_owner.release(self._claimed, self._owner_name())

    def stop(self) -> None:
        """Ask a running service to shut down; safe to call from any thread."""
        self._loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        if not self._stopping.done():
            self._stopping.set_result(None)
        else:
            self._hurry.set()  # a second signal: stop waiting for rounds in flight

    def _owner_name(self) -> str:
        return f"the service on port {self.port}"

    def _url(self, port: int) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"{'wss' if self.config.tls else 'ws'}://{host}:{port}"

    async def _load_target(self) -> bool:
        """Load the target on the device thread; False if asked to stop first."""
        def load():
            backend = self._loader()
            device_owner.claim(backend, self._owner_name())  # before any cache of it is touched
            self._claimed = backend
            fingerprint = vocab_fingerprint(backend.token_texts())
            self.queue.costs = costs_for(backend)  # the cost curve clients and streams price drafts with
            if grammars_available():
                grammar_vocab(backend)  # now, not on the device thread in the middle of the first such stream
            return backend, fingerprint, make_vocab_offer(backend, fingerprint)

        loading = asyncio.ensure_future(self.queue.run("load", load))
        await asyncio.wait({loading, self._stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            log.info("stopped while the target was loading")
            return False
        try:
            (backend, fingerprint, vocab), _ = loading.result()
        except Exception as exc:
            raise TargetLoadError(str(exc) or type(exc).__name__) from exc
        problem = kv_memory_problem(backend, self.guard.max_sessions)
        if problem:  # now, not when the OOM killer finds out with the sessions open
            raise SettingsRefused(problem)
        self.backend, self.fingerprint, self.vocab = backend, fingerprint, vocab
        self.limits = SessionLimits(max_draft=self.config.limits.max_draft,
                                    max_context=min(self.config.limits.max_context, backend.max_context))
        self.frames = FrameReader(self.limits.max_context, self.limits.max_draft)
        return True

    async def _tidy_every(self, period_s: float) -> None:
        """Let the backend free or shrink the KV pools sessions have left (in its turn on the device)."""
        tidy = getattr(self.backend, "tidy", None)
        while tidy is not None:
            await asyncio.sleep(period_s)
            try:
                freed, _ = await self.queue.run("tidy", tidy)
            except QueueClosed:
                return
            if freed:
                give_back_free_memory()

    async def _drain(self) -> None:
        """Refuse new sessions, let rounds in flight finish, then close everything (1001)."""
        self.state = "draining"
        self.metrics.ready.set(0)
        log.info("shutting down: %d session(s) open, %d round(s) in flight", len(self.sessions), len(self._busy))
        for session_id, ws in list(self._connections.items()):
            stream = self._streams.get(session_id)
            if stream is not None and stream.busy:  # end the stream with a last frame, then close
                asyncio.ensure_future(self._close_after(stream, ws))
            elif session_id not in self._busy:  # idle: nothing to finish
                asyncio.ensure_future(ws.close(CLOSE_GOING_AWAY, "the service is shutting down"))
        deadline = time.monotonic() + self.guard.drain_timeout_s
        while self.sessions and time.monotonic() < deadline and not self._hurry.is_set():
            await asyncio.sleep(0.02)
        if self.sessions:
            log.warning("closing %d session(s) that did not finish in time", len(self.sessions))

    @staticmethod
    async def _close_after(stream: ServerOnlyStream, ws: ServerConnection) -> None:
        await stream.finish("going_away")
        await ws.close(CLOSE_GOING_AWAY, "the service is shutting down")

    # ---- plain HTTP and admission ----------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            if self.queue.failure is not None:  # the device's worker stopped: only a restart serves again
                return self._unavailable(connection, f"failed: the device queue stopped ({self.queue.failure}); "
                                         f"restart the service\n")
            if self.state == "ready":
                return connection.respond(http.HTTPStatus.OK, "ok\n")
            return self._unavailable(connection, f"{self.state}\n")
        if path == "/metrics":
            if not self.config.public_metrics and (refused := self._unauthorized(connection, request)):
                return refused
            response = connection.respond(http.HTTPStatus.OK, self.metrics.render().decode())
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = self.metrics.content_type
            return response
        refused = self._unauthorized(connection, request)
        if refused is not None:
            return refused
        if path in (vocab_offer.INFO_PATH, vocab_offer.FILE_PATH):
            if self.state == "loading":
                return self._unavailable(connection, "the target model is still loading: retry in "
                                         f"{self.guard.retry_after_s:g} s\n")
            if path == vocab_offer.FILE_PATH and self.vocab.available:
                self.metrics.vocab_downloads.inc()
            return offer_response(self.vocab, path)
        if self.state != "ready":
            self.metrics.refusals.labels(self.state).inc()
            words = "the target model is still loading" if self.state == "loading" else "the service is shutting down"
            return self._unavailable(connection, f"{words}: retry in {self.guard.retry_after_s:g} s\n")
        self._admitted = {c for c in self._admitted if c.protocol.state is not State.CLOSED}
        if len(self._admitted) >= self.guard.max_sessions:
            self.metrics.refusals.labels("sessions_full").inc()
            return self._unavailable(
                connection, f"the service is at its limit of {self.guard.max_sessions} sessions: "
                f"retry in {self.guard.retry_after_s:g} s, or use another replica\n")
        address = _address_of(connection)
        limited = self._gate.refusal(address, sum(_address_of(c) == address for c in self._admitted))
        if limited is not None:
            why, wait_s = limited
            self.metrics.refusals.labels("client_limit").inc()
            response = connection.respond(http.HTTPStatus.TOO_MANY_REQUESTS, f"{why}: retry in {wait_s:.1f} s\n")
            response.headers["Retry-After"] = str(max(1, round(wait_s)))
            return response
        self._admitted.add(connection)
        return None

    def _process_response(self, connection: ServerConnection, request: Request, response: Response) -> None:
        """Answer a client's challenge with the proof that this service holds the token (wire/service_proof.py)."""
        challenge = request.headers.get(CHALLENGE_HEADER)
        if self.config.token is not None and challenge and len(challenge) <= MAX_CHALLENGE_CHARS \
                and response.status_code == http.HTTPStatus.SWITCHING_PROTOCOLS:
            response.headers[PROOF_HEADER] = proof(self.config.token, challenge)

    def _unauthorized(self, connection: ServerConnection, request: Request) -> Response | None:
        """The refusal of a request without the service's bearer token, or None when it may go on."""
        if self.config.token is None:
            return None
        authorizations = request.headers.get_all("Authorization")
        if len(authorizations) > 1:  # which one would count is ambiguous: refuse, do not pick
            self.metrics.refusals.labels("bad_request").inc()
            return connection.respond(http.HTTPStatus.BAD_REQUEST,
                                      f"{len(authorizations)} Authorization headers: send exactly one\n")
        problem = bearer_problem(authorizations[0] if authorizations else None, self.config.token)
        if problem:
            self.metrics.refusals.labels("unauthorized").inc()
            response = connection.respond(http.HTTPStatus.UNAUTHORIZED, problem + "\n")
            response.headers["WWW-Authenticate"] = 'Bearer realm="specwire"'
            return response
        return None

    def _unavailable(self, connection: ServerConnection, text: str) -> Response:
        response = connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, text)
        response.headers["Retry-After"] = str(max(1, round(self.guard.retry_after_s)))
        return response

    # ---- one session ------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        session = await self._open_session(ws)
        if session is None:
            return
        slog = session_log(log, session.id)
        bucket = TokenBucket(self.guard.rate_per_s, self.guard.rate_burst)
        idle = IdleClock(self.guard.idle_timeout_s)  # frames either way keep the session alive
        stream = self._streams[session.id] = ServerOnlyStream(session, self.queue, ws, self.metrics,
                                                               on_send=idle.touch, costs=self.queue.costs)
        closed = asyncio.ensure_future(ws.wait_closed())  # one watch for the session, not one per frame
        try:
            while True:
                try:
                    async with asyncio.timeout(idle.remaining_s()):
                        frame = await ws.recv()  # cancelling recv loses nothing (websockets' asyncio API)
                except TimeoutError:
                    if idle.remaining_s() > 0:  # the service sent (a stream) while the client was quiet
                        continue
                    slog.info("idle for %g s: closing", self.guard.idle_timeout_s)
                    self.metrics.refusals.labels("idle_timeout").inc()
                    await ws.close(CLOSE_IDLE_TIMEOUT, "idle timeout: reconnect and Sync")
                    break
                idle.touch()
                arrived = time.perf_counter()
                self._busy.add(session.id)
                try:
                    reply = await self._unless_closed(closed, self._answer(session, frame, bucket, arrived, slog, stream))
                    if reply is not None:  # a stream answers with its own frames
                        await ws.send(encode(reply))
                        idle.touch()
                finally:
                    self._busy.discard(session.id)
                if isinstance(reply, Error):
                    self.metrics.errors.labels(reply.code).inc()
                    if reply.fatal:
                        await ws.close(CLOSE_PROTOCOL_ERROR, reply.code[:100])
                        break
                    if reply.retry_after_s > 0:
                        # Over its rate: read nothing more from this connection until it may send
                        # again. A client that waits as told loses nothing; one that floods waits
                        # on its own socket's flow control, not on the service's event loop.
                        await asyncio.sleep(reply.retry_after_s)
                if self.state == "draining":
                    await ws.close(CLOSE_GOING_AWAY, "the service is shutting down")
                    break
        except ConnectionClosed:
            pass
        finally:
            closed.cancel()
            stream.stop()
            self._streams.pop(session.id, None)
            await self._close_session(session)
            slog.info("closed after %d committed tokens", len(session.committed))

    @staticmethod
    async def _unless_closed(closed: asyncio.Future, answering):
        """The answer, or ConnectionClosed as soon as the client is gone (`closed`, the connection's
        wait_closed): its work still queued (the pieces of a long prefill, minutes of a CPU) is
        cancelled, not run for nobody."""
        task = asyncio.ensure_future(answering)
        await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ConnectionClosed(None, None)
        return task.result()

    async def _answer(self, session: Session, frame: bytes | str, bucket: TokenBucket, arrived: float, slog,
                      stream: ServerOnlyStream):
        """The reply to one frame. A new kind of request is one more branch here."""
        wait_s = bucket.take(frame_cost(frame))  # a large frame costs its sender more of its budget
        if wait_s > 0:
            return Error("rate_limited", f"more than {self.guard.rate_per_s:g} requests a second (burst "
                         f"{self.guard.rate_burst}; a frame counts one per 4 KiB) on this connection: send it "
                         f"again in {wait_s:.3f} s",
                         retry_after_s=wait_s)
        try:
            message = self.frames.read(frame)
        except BadFrame as exc:
            return Error(exc.code, exc.message)
        except Exception as exc:  # a decoder corner not classified above: still only a bad frame
            slog.warning("undecodable frame (%s: %s)", type(exc).__name__, printable(str(exc), 200))
            return Error("bad_frame", f"could not decode the frame: {type(exc).__name__}")
        seq = getattr(message, "seq", 0)
        try:
            if isinstance(message, (Generate, Draft, Cancel)):
                return await stream.handle(message)
            if stream.busy:
                return Error("busy", "a server-only generation is streaming: send cancel and wait for its last "
                             "frame first", seq=seq)
            if isinstance(message, Verify):
                return await self._verify(session, message, arrived)
            if isinstance(message, Sync):
                return await self._sync(session, message, arrived)
            return Error("unexpected_message", "hello was already received: send verify, sync or generate",
                         seq=seq)
        except SessionError as exc:
            return Error(exc.code, exc.message, seq=seq, fatal=exc.fatal)
        except QueueClosed:
            if self.queue.failure is not None:
                return Error("internal", f"the service's device queue failed ({self.queue.failure}): reconnect to "
                             f"another replica; this one must be restarted", seq=seq, fatal=True)
            return Error("going_away", "the service is shutting down: reconnect", seq=seq, fatal=True)
        except Exception:  # a backend failure must not take the service down
            slog.exception("verification failed")
            return Error("internal", "the service failed to verify this round; reconnect and Sync",
                         seq=seq, fatal=True)

    async def _verify(self, session: Session, request: Verify, arrived: float):
        verdict, queue_s = await self.queue.run(session.id, session.verify_work(request), arrived)
        verdict.queue_s = queue_s
        self.metrics.record_round(len(request.draft), verdict.accepted, verdict.forward_s + verdict.accept_s,
                                  queue_s)
        self.metrics.record_draft_source(request.draft_source, len(request.draft), verdict.accepted)
        return verdict

    async def _sync(self, session: Session, request: Sync, arrived: float):
        synced, _ = await self.queue.run(session.id, Bookkeeping(partial(session.sync, request)), arrived)
        self.metrics.syncs.inc()
        return synced

    async def _open_session(self, ws: ServerConnection) -> Session | None:
        """Read and check Hello; answer Welcome, or a fatal Error and close."""
        try:
            async with asyncio.timeout(self.config.hello_timeout_s):
                frame = await ws.recv()
        except TimeoutError:
            await self._refuse(ws, CLOSE_PROTOCOL_ERROR, "hello_timeout",
                               f"no Hello within {self.config.hello_timeout_s:g} s of connecting")
            return None
        except ConnectionClosed:
            return None
        try:
            hello = self.frames.read(frame)
        except Exception as exc:  # BadFrame, or a decoder corner not classified
            await self._refuse(ws, CLOSE_PROTOCOL_ERROR, "bad_hello", f"the first message must be a Hello: {exc}")
            return None
        if not isinstance(hello, Hello):
            await self._refuse(ws, CLOSE_PROTOCOL_ERROR, "bad_hello",
                               f"the first message must be a Hello, got {type(hello).__name__.lower()}")
            return None
        backend = self.backend
        if hello.vocab_fingerprint != self.fingerprint or hello.vocab_size != backend.vocab_size:
            await self._refuse(
                ws, CLOSE_VOCAB_MISMATCH, "vocab_mismatch",
                f"the drafter's vocabulary ({hello.vocab_size} tokens, fingerprint {hello.vocab_fingerprint[:32]}) "
                f"differs from the target's ({backend.vocab_size} tokens, fingerprint {self.fingerprint}): "
                "use a draft model that shares the target's tokenizer")
            return None
        problems = hello_problems(hello)
        if problems:
            await self._refuse(ws, CLOSE_PROTOCOL_ERROR, "bad_sampling", "; ".join(problems))
            return None
        # Welcomed without waiting for a KV pool: a pool that must grow holds the device thread for
        # seconds on a CPU, and eight clients arriving together timed out waiting for it. The cache is
        # allocated in the session's turn right after (and at the latest by its first round).
        session = Session(backend, hello.sampling, hello.seed, self.limits, allocate=False)
        self.sessions[session.id] = session  # registered before the client can use it
        self._connections[session.id] = ws
        self.metrics.sessions.inc()
        self.metrics.sessions_total.inc()
        try:
            await ws.send(encode(Welcome(
                session_id=session.id, max_context=self.limits.max_context, max_draft=self.limits.max_draft,
                vocab_size=backend.vocab_size, target=backend.name, capabilities=self._capabilities(),
                max_frame_bytes=self.guard.max_frame_bytes, idle_timeout_s=self.guard.idle_timeout_s,
                pass_costs=self.queue.costs.curve(), trees=bool(getattr(backend, "tree_attention", False)),
                grammars=self._grammars)))
        except ConnectionClosed:
            await self._close_session(session)
            return None
        session_log(log, session.id).info("opened (%s)", printable(hello.client, 80) or "unnamed client")
        task = asyncio.ensure_future(self._allocate_ahead(session))
        self._allocating.add(task)
        task.add_done_callback(self._allocating.discard)
        return session

    async def _allocate_ahead(self, session: Session) -> None:
        """The session's KV cache, in its turn, likely before its first round arrives; a failure is
        left for that round to report (it tries again)."""
        try:
            await self.queue.run(session.id, session.ensure_cache)
        except (SessionError, QueueClosed) as exc:
            session_log(log, session.id).info("no KV cache yet: %s", exc)

    @functools.cached_property
    def _grammars(self) -> list[str]:
        """The Grammar kinds a Generate may carry here: every kind, where llguidance is installed."""
        return list(grammar_kinds) if grammars_available() else []

    def _capabilities(self) -> list[str]:
        # drafts: Draft frames in a stream; rewind: a Generate may keep part of the history (`keep`) and re-key
        capabilities = ["greedy", "sampling", "sync", "generate", "drafts", "rewind"]
        if self.vocab.available:  # GET /vocab.gguf: the target's tokenizer, for clients with no model file
            capabilities.append(vocab_offer.CAPABILITY)
        return capabilities

    async def _close_session(self, session: Session) -> None:
        """Forget the session and free its KV cache (on the device thread, in its turn)."""
        if self.sessions.pop(session.id, None) is None:
            return
        self._connections.pop(session.id, None)
        self.metrics.sessions.dec()
        try:
            await self.queue.run(session.id, session.close)
        except QueueClosed:
            session.close()  # the worker has stopped: nothing else touches the model now

    async def _refuse(self, ws: ServerConnection, close_code: int, code: str, message: str) -> None:
        log.info("refused a session: %s", printable(message, 500))  # it may quote what the client sent
        self.metrics.refusals.labels(code).inc()
        try:
            await ws.send(encode(Error(code, message, fatal=True)))
            await ws.close(close_code, code)
        except ConnectionClosed:
            pass


def _address_of(connection: ServerConnection) -> str:
    """The client's address (its IP, without the port)."""
    remote = connection.remote_address
    return str(remote[0]) if remote else ""
