"""Replicas of `specwire serve` behind a real HAProxy, run with packaging/haproxy/haproxy.cfg.

The packaged config is used as it is, except where it must name this machine's ports: the
frontend's `bind` line and the `server` lines are rewritten. Each replica is a child process on
a port of its own, so that it can be killed (SIGKILL) or stopped (SIGTERM: a drain) and started
again on the same port, where HAProxy's checks find it back. Its log (JSON lines) goes to a
file, for the errors to be counted by kind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CONFIG = PROJECT_ROOT / "packaging" / "haproxy" / "haproxy.cfg"
SPECWIRE = str(Path(sys.executable).parent / "specwire")
MISSING_HAPROXY = ("haproxy is not installed (looked on PATH and in /usr/sbin): install it with "
                   "`apt-get install haproxy`, or run `bash packaging/install.sh --dev` as root")


def haproxy_binary() -> str:
    """The haproxy program, or RuntimeError saying how to install it."""
    found = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy")
                                             if os.access(p, os.X_OK)), None)
    if found is None:
        raise RuntimeError(MISSING_HAPROXY)
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def haproxy_config(frontend_port: int, replica_ports: list[int]) -> str:
    """The packaged config with this machine's frontend port and replicas."""
    lines, servers_done = [], False
    for line in HAPROXY_CONFIG.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("bind "):
            line = f"    bind 127.0.0.1:{frontend_port}"
        elif stripped.startswith("server "):
            if servers_done:
                continue
            servers_done = True
            lines.extend(f"    server replica{i + 1} 127.0.0.1:{port}" for i, port in enumerate(replica_ports))
            continue
        lines.append(line)
    if not servers_done:
        raise ValueError(f"{HAPROXY_CONFIG} has no server line to replace")
    return "\n".join(lines) + "\n"


class Replica:
    """One `specwire serve` child on a fixed port; start() again after a kill or a stop.

    With `pace` (a target profile's name and a time scale) the child is the same service on an
    emulated device instead (benchmarks/emulation/serve.py): the target is still the real one,
    each of its passes held to the profile's time, so that a reply lasts long enough for a test
    to cut it in the middle (a tiny target alone ends a reply in milliseconds)."""

    def __init__(self, target: Path, port: int, log_path: Path, extra_args: list[str] | None = None,
                 pace: tuple[str, float] | None = None):
        self.target, self.port, self.log_path = target, port, log_path
        self.extra_args = extra_args or []
        self.pace = pace
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    def command(self) -> list[str]:
        if self.pace is None:
            return [SPECWIRE, "serve", "--target", str(self.target), "--port", str(self.port), "--threads", "1",
                    "--log-format", "json", *self.extra_args]
        profile, time_scale = self.pace
        return [sys.executable, "-m", "benchmarks.emulation.serve", "--profile", profile, "--time-scale",
                str(time_scale), "--target", str(self.target), "--port", str(self.port), *self.extra_args]

    def start(self, timeout_s: float = 60.0) -> None:
        log_file = open(self.log_path, "a")
        self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log_file, text=True,
                                        start_new_session=True,
                                        cwd=None if self.pace is None else PROJECT_ROOT)  # the module runs from it
        self.started_at = time.monotonic()  # the new process's age, while it loads too
        log_file.close()
        deadline = time.monotonic() + timeout_s
        line = self.process.stdout.readline()  # the service prints this once it takes sessions
        if not line.startswith("listening on ") or time.monotonic() > deadline:
            self.process.kill()
            raise RuntimeError(f"replica on port {self.port} did not start: {line!r} (log: {self.log_path})")
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def stop(self, sig: int = signal.SIGKILL, timeout_s: float = 60.0, wait: bool = True) -> None:
        """Send `sig`, and (with `wait`) wait for the process to end, killing it past timeout_s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        if not wait:
            return
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ReplicaPool:
    """`n` replicas of the target behind HAProxy; `url` is HAProxy's frontend."""

    def __init__(self, target: Path, n: int = 2, work_dir: Path | None = None, extra_args: list[str] | None = None,
                 pace: tuple[str, float] | None = None):
        self.haproxy_path = haproxy_binary()  # first: a missing haproxy is said before anything starts
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="specwire-replicas-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.replicas = [Replica(target, free_port(), self.work_dir / f"replica{i + 1}.log", extra_args, pace)
                         for i in range(n)]
        self.frontend_port = free_port()
        self.haproxy: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.frontend_port}"

    def start(self) -> "ReplicaPool":
        for replica in self.replicas:
            replica.start()
        config = self.work_dir / "haproxy.cfg"
        config.write_text(haproxy_config(self.frontend_port, [r.port for r in self.replicas]))
        check = subprocess.run([self.haproxy_path, "-c", "-q", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused {config}: {check.stdout}{check.stderr}")
        # -db: in the foreground, for this process to stop it; its messages go to a file
        with open(self.work_dir / "haproxy.log", "a") as log_file:
            self.haproxy = subprocess.Popen([self.haproxy_path, "-db", "-f", str(config)], stdout=log_file,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_until_up(len(self.replicas))
        return self

    def wait_until_up(self, n: int, timeout_s: float = 20.0) -> None:
        """Wait for HAProxy's frontend to accept connections (and its checks to find n replicas up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.haproxy.poll() is not None:
                raise RuntimeError(f"haproxy exited: {(self.work_dir / 'haproxy.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.frontend_port), timeout=1):
                    time.sleep(1.5 if n else 0)  # rise 2 at fastinter: two checks after the start
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"haproxy did not listen on port {self.frontend_port} within {timeout_s:g} s")

    def __enter__(self) -> "ReplicaPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for replica in self.replicas:
            replica.stop(signal.SIGKILL)
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()


def log_kind(message: str) -> str:
    """A log message with what varies (numbers, ids, addresses, quoted text) taken out: its kind."""
    message = re.sub(r"session \S+: ", "", message)
    message = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    message = re.sub(r"[0-9a-f]{8,}|\d+(\.\d+)?", "N", message)
    return " ".join(message.split()[:10])


def sessions_open(port: int) -> int:
    """How many sessions the replica on `port` holds now (its /metrics, asked directly), -1 if it is down."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return -1
    match = re.search(r"^specwire_sessions_open (\S+)$", text, re.M)
    return int(float(match.group(1))) if match else -1
