"""Clients arriving together: many `specwire generate` processes started at once against one service.

    .venv/bin/python -m benchmarks.arrivals [--clients 1,8,16] [--mode server] [--max-tokens 24]
        [--memory-cap-gb 12] [--json FILE]

A team's editors at nine, a script's fan-out: N `specwire generate --json` processes start at
the same moment against `specwire serve` on the default pair, started as the README starts it
(nothing pinned, no flags). For each N, one row: how many clients exit 0, how many replies are
token-identical to the reply of one client alone, the slowest first token and the last exit
(from the common start), the sessions the service opened (more than N: clients gave up on a busy
service and opened another), and the service's peak resident memory, sampled every 0.2 s. A
service that passes --memory-cap-gb is killed and its row says so: the kernel's OOM killer would
end it later, with every session in it, and take the machine's memory meanwhile.

The service is started afresh for each N (its pools and memory from zero, as after a restart).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass

from benchmarks.readme_flow import start
from benchmarks.session_wave import rss_bytes

PROMPT = "def fibonacci(n):"
GIB = 1 << 30
SAMPLE_S = 0.2


@dataclass
class Arrival:
    clients: int
    succeeded: int
    same_as_alone: int
    first_token_max_s: float
    last_exit_s: float
    sessions_opened: int
    peak_rss_gb: float
    killed_at_cap: bool
    errors: list[str]


class MemoryWatch(threading.Thread):
    """Samples a process's resident memory; kills it past `cap_bytes`."""

    def __init__(self, pid: int, cap_bytes: int):
        super().__init__(daemon=True)
        self.pid, self.cap_bytes = pid, cap_bytes
        self.peak = 0
        self.killed = False
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, RuntimeError):
                return  # the process has ended
            if self.peak > self.cap_bytes:
                self.killed = True
                subprocess.run(["kill", "-9", str(self.pid)], check=False)
                return


def sessions_opened(url: str) -> int:
    with urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("specwire_sessions_opened_total "):
                return int(float(line.split()[1]))
    return -1


def generate_command(url: str, mode: str, max_tokens: int) -> list[str]:
    return [sys.executable, "-m", "app.cli", "generate", "--server", url, "--mode", mode, "--prompt", PROMPT,
            "--max-tokens", str(max_tokens), "--json"]


def arrive(clients: int, mode: str, max_tokens: int, cap_bytes: int) -> Arrival:
    service, url = start([sys.executable, "-m", "app.cli", "serve", "--port", "0", "--exit-with-parent"])
    watch = MemoryWatch(service.pid, cap_bytes)
    watch.start()
    try:
        alone = json.loads(subprocess.run(generate_command(url, mode, max_tokens), capture_output=True, text=True,
                                          check=True, timeout=600).stdout)["token_ids"]
        opened_before = sessions_opened(url)
        started = time.monotonic()
        processes = [subprocess.Popen(generate_command(url, mode, max_tokens), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(clients)]
        outputs, exits = [], []
        for process in processes:
            out, err = process.communicate(timeout=900)
            exits.append(time.monotonic() - started)
            outputs.append((process.returncode, out, err))
        opened = sessions_opened(url) - opened_before if service.poll() is None else -1
    finally:
        watch.done.set()
        service.kill()
        service.wait()
    replies = [json.loads(out) for code, out, _ in outputs if code == 0]
    return Arrival(clients=clients, succeeded=len(replies),
                   same_as_alone=sum(reply["token_ids"] == alone for reply in replies),
                   first_token_max_s=max((reply["stats"]["first_token_s"] for reply in replies), default=0.0),
                   last_exit_s=max(exits), sessions_opened=opened, peak_rss_gb=watch.peak / GIB,
                   killed_at_cap=watch.killed,
                   errors=sorted({err.strip().splitlines()[-1][:200] for code, _, err in outputs if code and err.strip()}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1,8,16", help="comma-separated counts of clients started together")
    parser.add_argument("--mode", default="server", help="generate's --mode (default: server, the baseline)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--memory-cap-gb", type=float, default=12.0,
                        help="kill the service past this resident memory (default: 12)")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args(argv)
    rows = []
    print("| clients | exit 0 | same as alone | first token, slowest | last exit | sessions opened | "
          "service peak memory |\n|---|---|---|---|---|---|---|")
    for clients in (int(n) for n in args.clients.split(",")):
        row = arrive(clients, args.mode, args.max_tokens, int(args.memory_cap_gb * GIB))
        rows.append(row)
        memory = f"{row.peak_rss_gb:.1f} GB" + (" (killed at the cap)" if row.killed_at_cap else "")
        print(f"| {clients} | {row.succeeded} | {row.same_as_alone} | {row.first_token_max_s:.1f} s | "
              f"{row.last_exit_s:.1f} s | {row.sessions_opened if row.sessions_opened >= 0 else 'n/a'} | {memory} |",
              flush=True)
        for error in row.errors:
            print(f"  error: {error}", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(row) for row in rows], out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
