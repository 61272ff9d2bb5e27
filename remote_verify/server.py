"""The verification service: a WebSocket server that runs sessions against one target.

Auth and `/healthz` are answered in `process_request`, before the upgrade. Each
connection is one session; its model work runs off the event loop on the device's single
worker thread, so the loop keeps answering pings and other clients while a forward pass
runs. SIGINT/SIGTERM close the listener and every connection with "going away".
"""

from __future__ import annotations

import asyncio
import hmac
import http
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import msgspec
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from remote_verify.backends import TargetBackend
from remote_verify.protocol import (
    CLOSE_PROTOCOL_ERROR,
    CLOSE_VOCAB_MISMATCH,
    SUBPROTOCOL,
    Cancel,
    Error,
    Generate,
    Hello,
    Sync,
    Verify,
    Welcome,
    decode_client_message,
    encode,
    vocab_fingerprint,
)
from remote_verify.session import Session, SessionError, SessionLimits
from remote_verify.streaming import ServerOnlyStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None  # bearer token; None accepts every client (loopback use)
    max_frame_bytes: int = 4 * 1024 * 1024  # a 32-token sampled draft is ~20 KiB
    hello_timeout_s: float = 10.0  # a client must introduce itself promptly
    ping_interval_s: float = 20.0
    limits: SessionLimits = SessionLimits()


class VerifyService:
    def __init__(self, backend: TargetBackend, config: ServiceConfig):
        self.backend = backend
        self.config = config
        self.limits = SessionLimits(
            max_draft=config.limits.max_draft,
            max_context=min(config.limits.max_context, backend.max_context),
        )
        self.fingerprint = vocab_fingerprint(backend.token_texts())
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="target")  # one per device
        self.sessions: dict[str, Session] = {}

    async def run(self, on_ready: Callable[[str], None], handle_signals: bool = True) -> None:
        """Serve until SIGINT/SIGTERM or stop(); `on_ready(url)` is called once clients can connect."""
        loop = asyncio.get_running_loop()
        self._stopping = loop.create_future()
        self._loop = loop
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._request_stop)
        async with serve(
            self._handle,
            self.config.host,
            self.config.port,
            subprotocols=[SUBPROTOCOL],
            process_request=self._process_request,
            max_size=self.config.max_frame_bytes,
            ping_interval=self.config.ping_interval_s,
        ) as server:
            port = server.sockets[0].getsockname()[1]
            on_ready(f"ws://{self.config.host}:{port}")
            await self._stopping
            log.info("shutting down: closing %d session(s)", len(self.sessions))
        self.worker.shutdown(wait=True)

    def stop(self) -> None:
        """Ask a running service to shut down; safe to call from any thread."""
        self._loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        if not self._stopping.done():
            self._stopping.set_result(None)

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "ok\n")
        if self.config.token is not None:
            header = request.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                return connection.respond(
                    http.HTTPStatus.UNAUTHORIZED,
                    "missing bearer token: send 'Authorization: Bearer <token>' (specwire: --token-file)\n")
            if not hmac.compare_digest(header[len("Bearer "):].encode(), self.config.token.encode()):
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "wrong bearer token\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        session = await self._open_session(ws)
        if session is None:
            return
        loop = asyncio.get_running_loop()
        stream = ServerOnlyStream(session, lambda fn: loop.run_in_executor(self.worker, fn), ws)
        try:
            async for frame in ws:
                message = self._decode(frame)
                if isinstance(message, (Generate, Cancel)):
                    reply = await stream.handle(message)
                elif stream.busy and not isinstance(message, Error):
                    reply = Error("busy", "a server-only generation is streaming: send cancel and wait for "
                                          "its last frame first", seq=getattr(message, "seq", 0))
                else:
                    reply = await self._answer(loop, session, message)
                if reply is None:
                    continue
                await ws.send(encode(reply))
                if isinstance(reply, Error) and reply.fatal:
                    await ws.close(CLOSE_PROTOCOL_ERROR, reply.code)
                    break
        except ConnectionClosed:
            pass
        finally:
            stream.stop()
            self.sessions.pop(session.id, None)
            log.info("session %s closed after %d committed tokens", session.id, len(session.committed))

    @staticmethod
    def _decode(frame: bytes | str):
        """The client's message, or the Error that answers an undecodable frame."""
        if isinstance(frame, str):
            return Error("bad_frame", "text frames are not part of the protocol: send binary msgpack frames")
        try:
            return decode_client_message(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return Error("bad_frame", f"could not decode the frame: {exc}")

    async def _answer(self, loop: asyncio.AbstractEventLoop, session: Session, message):
        if isinstance(message, Error):
            return message
        try:
            if isinstance(message, Verify):
                return await loop.run_in_executor(self.worker, session.verify, message)
            if isinstance(message, Sync):
                return await loop.run_in_executor(self.worker, session.sync, message)
            return Error("unexpected_message", "hello was already received: send verify or sync",
                         seq=getattr(message, "seq", 0))
        except SessionError as exc:
            return Error(exc.code, exc.message, seq=getattr(message, "seq", 0), fatal=exc.fatal)
        except Exception:  # a backend failure must not take the service down
            log.exception("session %s: verification failed", session.id)
            return Error("internal", "the service failed to verify this round; reconnect and Sync", fatal=True)

    async def _open_session(self, ws: ServerConnection) -> Session | None:
        """Read and check Hello; answer Welcome, or a fatal Error and close."""
        try:
            frame = await asyncio.wait_for(ws.recv(), self.config.hello_timeout_s)
            hello = decode_client_message(frame) if isinstance(frame, bytes) else None
        except (asyncio.TimeoutError, ConnectionClosed):
            return None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            hello = None
            log.info("bad hello: %s", exc)
        if not isinstance(hello, Hello):
            await self._refuse(ws, CLOSE_PROTOCOL_ERROR, "bad_hello", "the first message must be a msgpack Hello")
            return None
        if hello.vocab_fingerprint != self.fingerprint or hello.vocab_size != self.backend.vocab_size:
            await self._refuse(
                ws, CLOSE_VOCAB_MISMATCH, "vocab_mismatch",
                f"the drafter's vocabulary ({hello.vocab_size} tokens, fingerprint {hello.vocab_fingerprint}) "
                f"differs from the target's ({self.backend.vocab_size} tokens, fingerprint {self.fingerprint}): "
                "use a draft model that shares the target's tokenizer")
            return None
        problems = hello.sampling.problems()
        if problems:
            await self._refuse(ws, CLOSE_PROTOCOL_ERROR, "bad_sampling", "; ".join(problems))
            return None
        session = Session(self.backend, hello.sampling, hello.seed, self.limits)
        self.sessions[session.id] = session  # registered before the client can use it
        try:
            await ws.send(encode(Welcome(
                session_id=session.id, max_context=self.limits.max_context, max_draft=self.limits.max_draft,
                vocab_size=self.backend.vocab_size, target=self.backend.name,
                capabilities=["greedy", "sampling", "sync", "generate"])))
        except ConnectionClosed:
            del self.sessions[session.id]
            return None
        log.info("session %s opened (%s)", session.id, hello.client or "unnamed client")
        return session

    async def _refuse(self, ws: ServerConnection, close_code: int, code: str, message: str) -> None:
        log.info("refused a session: %s", message)
        try:
            await ws.send(encode(Error(code, message, fatal=True)))
            await ws.close(close_code, code)
        except ConnectionClosed:
            pass
