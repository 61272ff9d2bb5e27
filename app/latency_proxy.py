"""A loopback TCP proxy that gives a link the faults users' links have: a far service, on one machine.

Every chunk of bytes is held for half the round-trip time (plus or minus jitter) in each
direction before it is passed on; order is kept, so jitter delays bytes but never reorders
them (as on a TCP connection). On top of that (app/link_faults.py): a bandwidth cap, stalls
(every byte held, both ways, for a while, the connection left open) and drops (both sides
cut at once) at random times, seeded so that a run repeats. It speaks no protocol of its
own, so WebSocket, TLS and plain HTTP (`/healthz`) go through unchanged.

A benchmark whose emulated users run as threads of one process starts the proxy in a process of
its own (`start_in_process`): on a thread beside them, it waited for their turns at the
interpreter, and bytes left it late (see `start_in_process`).

    specwire proxy --upstream ws://127.0.0.1:8765 --rtt-ms 50 --jitter-ms 5
    specwire generate --server ws://127.0.0.1:<proxy port> ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import threading
from urllib.parse import urlsplit

from app.link_faults import ConnectionFaults, LinkFaults

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
START_TIMEOUT_S = 30.0  # a proxy process imports and listens within this


class _Connection:
    """One client's connection through the proxy: its draws, and whether it is stalled or cut."""

    def __init__(self, faults: ConnectionFaults, writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]):
        self.faults = faults
        self.writers = writers
        self.stalled_until = 0.0  # loop time: no byte moves before it
        self.cut = False

    def drop(self) -> None:
        """Cut both sides at once (a reset, no goodbye), as a link that goes away does."""
        self.cut = True
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()


class LatencyProxy:
    def __init__(self, upstream: str, rtt_ms: float = 0.0, jitter_ms: float = 0.0,
                 host: str = "127.0.0.1", port: int = 0, seed: int | None = None,
                 faults: LinkFaults | None = None):
        """`faults` gives every fault at once; without it, rtt_ms and jitter_ms only."""
        parts = urlsplit(upstream if "://" in upstream else f"ws://{upstream}")
        if not parts.hostname or not parts.port:
            raise ValueError(f"the upstream must be HOST:PORT or ws://HOST:PORT, got {upstream!r}")
        self.faults = faults or LinkFaults(rtt_ms=rtt_ms, jitter_ms=jitter_ms)
        problems = self.faults.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.upstream = upstream
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.scheme = parts.scheme if parts.scheme in ("ws", "wss") else "ws"
        self.rtt_ms, self.jitter_ms = self.faults.rtt_ms, self.faults.jitter_ms
        self.host, self.port = host, port
        self.seed = seed
        self.stalls = 0  # how many stalls and drops the proxy has made, on all connections
        self.drops = 0
        self._numbered = 0
        self._live: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._process: multiprocessing.process.BaseProcess | None = None  # start_in_process's
        self._stopped: asyncio.Event | None = None  # set by stop() (run in a thread)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._connect, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("proxy %s -> %s:%d: %s", self.url, self.upstream_host, self.upstream_port, self.faults.describe())

    async def serve_forever_started(self) -> None:
        """Serve until cancelled, after start()."""
        async with self._server:
            await self._server.serve_forever()

    def start_in_thread(self) -> str:
        """Run on a background thread (for benchmarks and tests); returns the proxy's URL."""
        ready = threading.Event()

        async def run() -> None:
            self._stopped = asyncio.Event()
            await self.start()
            ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server.serve_forever()
            await self._stopped.wait()  # after stop_listening(), the open connections go on

        self._thread = threading.Thread(target=lambda: asyncio.run(run()), name="latency-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the latency proxy did not start")
        return self.url

    def start_in_process(self) -> str:
        """Run in a process of its own (for benchmarks); returns the proxy's URL. Faults on demand
        (`stall_all`, `drop_all`) are the thread's only; the seeded ones work alike.

        The proxy stands for the network, so it must not wait on what the clients do. On a thread
        beside 32 emulated users' threads (benchmarks.load's users up to 64 run in its own process),
        it waited for their turns at the interpreter's lock: with the default mode's guesses to carry
        (four times server-only's chunks) its chunks left 1 ms late at the median but 29 ms at p90
        and 71 ms at p99 (server-only's: 2, 5 and 7 ms), a few emulated ms at a time scale of 10,
        charged to the mode whose clients work most."""
        context = multiprocessing.get_context("spawn")  # not fork: the caller may run threads
        ours, theirs = context.Pipe()
        self._process = context.Process(target=_relay_in_process, name="latency-proxy", daemon=True,
                                        args=(theirs, self.upstream, self.faults, self.host, self.port, self.seed))
        self._process.start()
        theirs.close()
        try:
            if not ours.poll(START_TIMEOUT_S):
                raise RuntimeError(f"the latency proxy's process did not start within {START_TIMEOUT_S:g} s")
            started = ours.recv()
        except EOFError:
            started = "it exited before listening"
        finally:
            ours.close()
        if isinstance(started, str):
            self.stop()
            raise RuntimeError(f"the latency proxy's process failed: {started}")
        self.port = started
        return self.url

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.join(5)
            self._process = None
        if self._loop is not None and self._server is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._server.close)
            if self._stopped is not None:
                self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(5)

    def stop_listening(self) -> None:
        """Take no new connection (the port is freed), while the open ones go on: a far end out of reach."""
        self._on_loop(self._server.close)

    # ---- faults on demand (tests; thread-safe) ------------------------------------------

    def stall_all(self, seconds: float) -> None:
        """Stall every open connection for `seconds` from now: no byte moves, nothing is closed."""
        def stall() -> None:
            for connection in self._live:
                self._stall(connection, seconds)
        self._on_loop(stall)

    def drop_all(self) -> None:
        """Cut every open connection now."""
        def drop() -> None:
            for connection in list(self._live):
                self._drop(connection)
        self._on_loop(drop)

    def _on_loop(self, act) -> None:
        if self._loop is None:
            raise RuntimeError("faults on demand need the proxy on a thread of this process (start_in_thread)")
        self._loop.call_soon_threadsafe(act)

    def _stall(self, connection: _Connection, seconds: float) -> None:
        self.stalls += 1
        connection.stalled_until = max(connection.stalled_until, self._loop.time() + seconds)
        log.info("proxy: stalling a connection for %.1f s", seconds)

    def _drop(self, connection: _Connection) -> None:
        if not connection.cut:
            self.drops += 1
            log.info("proxy: dropping a connection")
            connection.drop()

    # ---- relaying -----------------------------------------------------------------------

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        faults = ConnectionFaults(self.faults, self.seed, self._numbered)
        self._numbered += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError as exc:
            log.warning("proxy: cannot reach %s:%d: %s", self.upstream_host, self.upstream_port, exc)
            client_writer.close()
            return
        connection = _Connection(faults, (client_writer, upstream_writer))
        self._live.add(connection)
        scheduler = asyncio.create_task(self._schedule_faults(connection))
        try:
            await asyncio.gather(self._carry(connection, client_reader, upstream_writer),
                                 self._carry(connection, upstream_reader, client_writer), return_exceptions=True)
        except asyncio.CancelledError:  # the proxy is stopping: drop the connection quietly
            for writer in (client_writer, upstream_writer):
                writer.close()
        finally:
            scheduler.cancel()
            self._live.discard(connection)

    async def _schedule_faults(self, connection: _Connection) -> None:
        """This connection's stalls and its drop, at the times its generator draws."""
        loop = asyncio.get_running_loop()
        next_stall, next_drop = connection.faults.next_stall_in_s(), connection.faults.next_drop_in_s()
        now = loop.time()
        stall_at = now + next_stall if next_stall is not None else None
        drop_at = now + next_drop if next_drop is not None else None
        while stall_at is not None or drop_at is not None:
            due = min(t for t in (stall_at, drop_at) if t is not None)
            await asyncio.sleep(max(0.0, due - loop.time()))
            if drop_at is not None and drop_at <= loop.time():
                self._drop(connection)
                return
            self._stall(connection, self.faults.stall_s)
            stall_at = loop.time() + self.faults.stall_s + connection.faults.next_stall_in_s()

    async def _carry(self, connection: _Connection, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk released one way's delay after it arrived, in order, no
        sooner than the bandwidth allows and never during a stall."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            wire_free = 0.0  # when the capped wire has sent what went before
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                while connection.stalled_until > loop.time() and not connection.cut:  # a stall may grow
                    await asyncio.sleep(connection.stalled_until - loop.time())
                if not data or connection.cut:
                    break
                wire_free = max(wire_free, loop.time()) + connection.faults.transfer_s(len(data))
                await asyncio.sleep(max(0.0, wire_free - loop.time()))
                writer.write(data)
                await writer.drain()

        releaser = asyncio.create_task(release())
        last_due = 0.0
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                last_due = max(last_due, loop.time() + connection.faults.one_way_s())  # jitter never reorders
                queue.put_nowait((last_due, data))
                if not data:  # end of stream travels with the same delay
                    break
            await releaser
        except (ConnectionError, OSError):
            releaser.cancel()
        finally:
            if connection.cut:
                releaser.cancel()
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.close()


def _relay_in_process(pipe, upstream: str, faults: LinkFaults, host: str, port: int, seed: int | None) -> None:
    """A proxy process's life (`LatencyProxy.start_in_process`): listen, send the port (or why not),
    relay until terminated."""
    relay = LatencyProxy(upstream, host=host, port=port, seed=seed, faults=faults)

    async def run() -> None:
        try:
            await relay.start()
        except OSError as exc:
            pipe.send(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
            return
        pipe.send(relay.port)
        pipe.close()
        await relay.serve_forever_started()

    asyncio.run(run())
