"""The embedded verification service: `specwire serve` on 127.0.0.1 in a child process.

Started on a free port (`--port 0`), ready when it prints "listening on URL". It stops with
the chat whatever way the chat ends: on a normal exit the chat terminates it, and on a
crash or a SIGKILL of the chat the child sees its standard input, a pipe from the chat,
reach end-of-file (`serve --exit-with-parent`) and stops itself. If it dies while the chat
runs it is started again on the same port, where the client link's reconnects find it.

It is the chat's alone: it takes a random token, written as the first line of that pipe
(`serve --token-stdin`: never on a command line, which other users can read), and the same
token after a restart. The chat connects with it and asks the service to prove it holds it
(wire/service_proof.py), so a program of another user that takes the port while the service
is down hears nothing of the conversation.
"""

from __future__ import annotations

import collections
import logging
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

log = logging.getLogger(__name__)

# The chat's session, and one a reconnect or new settings open before the old one has closed: the
# service checks at start that this many KV caches fit this machine's memory (32, serve's default,
# would refuse the default pair on a machine with less than 8 GB free).
SESSIONS = 4
READY_TIMEOUT_S = 900.0  # a cold torch start de-quantizes the target first (about 80 s here)
MAX_RESTARTS = 3  # in a row without a stable minute between them
STABLE_S = 60.0  # a service up this long resets the restart count


class EmbeddedServiceError(RuntimeError):
    """The service could not be started; the message carries what it printed."""


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class EmbeddedService:
    """One `specwire serve` child: start it, wait for it, restart it if it dies, stop it."""

    def __init__(self, target: str, backend: str = "auto", thread_flags: Sequence[str] = (), restart: bool = True,
                 on_output: Callable[[str], None] | None = None,
                 on_event: Callable[[str, bool], None] | None = None):
        self.target = target
        self.backend = backend
        self.thread_flags = list(thread_flags)  # serve's thread flags (none: its default, every physical core)
        self.restart = restart
        self.on_output = on_output  # each line the service logs (loading progress)
        self.on_event = on_event  # (what happened, whether it is running now)
        self.process: subprocess.Popen | None = None
        self.token = secrets.token_urlsafe(32)  # the clients' bearer token: this chat's only
        self.url: str | None = None
        self.port = 0
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._last_lines: collections.deque[str] = collections.deque(maxlen=12)
        self._restarts = 0
        self._started_at = 0.0
        self._lock = threading.Lock()  # launching and stopping exclude each other

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None and self.url is not None

    def command(self) -> list[str]:
        # -P: never import a stray `app` package from the current directory
        return [sys.executable, "-P", "-m", "app.cli", "-v", "serve", "--target", self.target,
                "--backend", self.backend, "--host", "127.0.0.1", "--port", str(self.port), "--exit-with-parent",
                "--token-stdin", "--max-sessions", str(SESSIONS), *self.thread_flags]

    def launch(self) -> None:
        """Start the child without waiting for it (the caller can load the drafter meanwhile)."""
        with self._lock:
            self._stopping.clear()
            self._launch()

    def _launch(self) -> None:
        self._ready.clear()
        self.url = None
        self._last_lines.clear()
        log.info("starting the embedded service: %s", " ".join(self.command()))
        # stdin is the parent-death pipe: the token's line, then nothing until the kernel closes it when we exit
        process = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, errors="replace")
        self.process = process
        try:
            process.stdin.write(self.token + "\n")
            process.stdin.flush()
        except OSError:  # it died at once: wait_ready reports what it said
            pass
        threading.Thread(target=self._read_stdout, args=(process,), daemon=True,
                         name="specwire-service-stdout").start()
        threading.Thread(target=self._read_stderr, args=(process,), daemon=True,
                         name="specwire-service-stderr").start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Block until the service listens; its URL. Raises EmbeddedServiceError if it exits first."""
        process = self.process
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if process.poll() is not None or time.monotonic() > deadline:
                if process.poll() is None:
                    process.kill()
                    raise EmbeddedServiceError(f"the verification service was not ready after {timeout_s:.0f} s")
                time.sleep(0.1)  # let the stderr reader catch the last lines
                raise EmbeddedServiceError(self._failure(process.returncode))
        if self.url is None:
            raise EmbeddedServiceError(self._failure(process.wait()))
        self.port = int(self.url.rsplit(":", 1)[1])  # restarts reuse it: the link reconnects there
        self._started_at = time.monotonic()
        threading.Thread(target=self._watch, args=(process,), daemon=True, name="specwire-service-watch").start()
        return self.url

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        self.launch()
        return self.wait_ready(timeout_s)

    def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after 10 s) and do not restart it."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.info("the embedded service stopped (%s)", describe_exit(process.returncode))

    def _failure(self, returncode: int) -> str:
        lines = [line.removeprefix("specwire: error: ") for line in self._last_lines
                 if "Traceback" not in line and not line.startswith("  ")]
        said = ("\n" + "\n".join(lines[-4:])) if lines else ""
        return f"the verification service stopped before it was ready ({describe_exit(returncode)}){said}"

    def _read_stdout(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            if line.startswith("listening on ") and not self._ready.is_set():
                self.url = line.split()[-1]
                self._ready.set()
        self._ready.set()  # end of output: wait_ready stops waiting either way

    def _read_stderr(self, process: subprocess.Popen) -> None:
        for line in process.stderr:
            line = line.rstrip()
            self._last_lines.append(line)
            log.info("service: %s", line)
            if self.on_output is not None and line:
                self.on_output(line)

    def _watch(self, process: subprocess.Popen) -> None:
        """Restart the service if it dies while the chat runs (unless stopping, or it keeps dying)."""
        returncode = process.wait()
        if self._stopping.is_set() or process is not self.process:
            return
        if time.monotonic() - self._started_at > STABLE_S:
            self._restarts = 0
        what = f"the embedded verification service stopped ({describe_exit(returncode)})"
        log.warning(what)
        if not self.restart or self._restarts >= MAX_RESTARTS:
            self._notify(f"{what}; /online starts it again", False)
            return
        self._restarts += 1
        self._notify(f"{what}; restarting it", False)
        time.sleep(0.5)  # a crash loop must not spin
        try:
            with self._lock:
                if self._stopping.is_set():
                    return
                self._launch()
            self.wait_ready()
        except (EmbeddedServiceError, OSError) as exc:
            self._notify(f"could not restart the verification service: {exc}; /online tries again", False)
            return
        self._notify("the embedded verification service is running again", True)

    def _notify(self, what: str, running: bool) -> None:
        if self.on_event is not None:
            try:
                self.on_event(what, running)
            except Exception:  # a listener's bug must not stop the supervision
                log.exception("service event listener failed")
