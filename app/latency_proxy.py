"""A loopback TCP proxy that adds round-trip time and jitter: a far service, on one machine.

Every chunk of bytes is held for half the round-trip time (plus or minus jitter) in each
direction before it is passed on; order is kept, so jitter delays bytes but never reorders
them (as on a TCP connection). It speaks no protocol of its own, so WebSocket, TLS and
plain HTTP (`/healthz`) go through unchanged.

    specwire proxy --upstream ws://127.0.0.1:8765 --rtt-ms 50 --jitter-ms 5
    specwire generate --server ws://127.0.0.1:<proxy port> ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024


class LatencyProxy:
    def __init__(self, upstream: str, rtt_ms: float = 0.0, jitter_ms: float = 0.0,
                 host: str = "127.0.0.1", port: int = 0, seed: int | None = None):
        parts = urlsplit(upstream if "://" in upstream else f"ws://{upstream}")
        if not parts.hostname or not parts.port:
            raise ValueError(f"the upstream must be HOST:PORT or ws://HOST:PORT, got {upstream!r}")
        if rtt_ms < 0 or jitter_ms < 0:
            raise ValueError("--rtt-ms and --jitter-ms cannot be negative")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.scheme = parts.scheme if parts.scheme in ("ws", "wss") else "ws"
        self.rtt_ms = rtt_ms
        self.jitter_ms = jitter_ms
        self.host, self.port = host, port
        self._random = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def one_way_s(self) -> float:
        """Half the round trip, plus or minus up to half the jitter, never negative."""
        jitter = self._random.uniform(-self.jitter_ms, self.jitter_ms) / 2
        return max(0.0, (self.rtt_ms / 2 + jitter) / 1000)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._connect, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("proxy %s -> %s:%d, round trip %.0f ms (jitter %.0f ms)", self.url, self.upstream_host,
                 self.upstream_port, self.rtt_ms, self.jitter_ms)

    async def serve_forever_started(self) -> None:
        """Serve until cancelled, after start()."""
        async with self._server:
            await self._server.serve_forever()

    def start_in_thread(self) -> str:
        """Run on a background thread (for benchmarks and tests); returns the proxy's URL."""
        ready = threading.Event()

        async def run() -> None:
            await self.start()
            ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server.serve_forever()

        self._thread = threading.Thread(target=lambda: asyncio.run(run()), name="latency-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the latency proxy did not start")
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        if self._thread is not None:
            self._thread.join(5)

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError as exc:
            log.warning("proxy: cannot reach %s:%d: %s", self.upstream_host, self.upstream_port, exc)
            client_writer.close()
            return
        try:
            await asyncio.gather(self._carry(client_reader, upstream_writer),
                                 self._carry(upstream_reader, client_writer), return_exceptions=True)
        except asyncio.CancelledError:  # the proxy is stopping: drop the connection quietly
            for writer in (client_writer, upstream_writer):
                writer.close()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk released one_way_s() after it arrived, in order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    break
                writer.write(data)
                await writer.drain()

        releaser = asyncio.create_task(release())
        last_due = 0.0
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                last_due = max(last_due, loop.time() + self.one_way_s())  # jitter never reorders
                queue.put_nowait((last_due, data))
                if not data:  # end of stream travels with the same delay
                    break
            await releaser
        except (ConnectionError, OSError):
            releaser.cancel()
        finally:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.close()
