"""An hour of load as an operator runs the service: replicas behind HAProxy, users' faulty links.

    python -m benchmarks.soak [--minutes 60] [--clients 16] [--replicas 2] [--kill-every 300]
                              [--json FILE] [--tokens 48] [--rtt-ms 40] [--jitter-ms 20]
                              [--disconnect-every 30] [--stall-every S --stall-s S] [--bandwidth-kbps K]
                              [--seed 1] [--work-dir DIR]

Builds the tiny models, starts --replicas `specwire serve` replicas behind a real HAProxy
(packaging/haproxy/haproxy.cfg, benchmarks/replica_pool.py) and one `specwire proxy` in front
of HAProxy with the users' link: --rtt-ms plus --jitter-ms, each connection cut at a random
time every --disconnect-every seconds on average (seeded). --clients clients then run in the
default mode (a tiny drafter each, guesses streamed), greedy, reply after reply, for --minutes.
Every --kill-every seconds one replica is stopped, by SIGKILL and SIGTERM (a drain) in turn,
and started again; the last replica is never stopped, so that its memory is watched for the
whole run.

Each prompt's reference (the target alone: one token a round, k = 0) is computed once, before
the load. Reported (and written with --json):
  replies, lost (a reply that raised or came back short), differing (not the reference),
  offline_tokens (unverified tokens: the link was not back within the wait);
  reconnect_p99_s: a reply's gap between the last token before a new connection and the first
  after it (what the user waits; it includes the new session's rebuild from the history);
  link_down_p99_s: from a link noticing the loss to its new connection;
  the services' RSS and open files every --sample-every seconds; rss_growth: the never-stopped
  replica's RSS in the last sample under load over its RSS after the first minute, minus one
  (rss_growth_idle: once the clients have gone); rss_growth_same_kv: the same last sample over
  the first after the first minute whose KV pools held as many slots (a pool grows with the
  sessions a replica holds, and a kill sends it all of them); open_files at its start, and after the
  clients closed;
  errors by kind: the warnings and errors the replicas logged (JSON lines) and the clients',
  planned (a planned fault's) or not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

from benchmarks.replica_pool import SPECWIRE, ReplicaPool, log_kind
from benchmarks.session_wave import PROMPTS, percentiles, reference_continuations
from local_draft.draft_model import DraftModel
from local_draft.service_link import LinkState, ServiceLink
from local_draft.stream_speculator import StreamSpeculator
from models.tiny import build_tiny_models
from wire.protocol import SamplingParams

log = logging.getLogger("benchmarks.soak")

TAKEOVER_WAIT_S = 10.0  # a client waits this long for a replica to take over before going offline
# what the planned faults make services and clients log: a kill, a drain, a cut link
PLANNED = ("is DOWN", "is UP", "shutting down", "lost the verification service", "continuing offline", "did not finish in time",
           "keepalive ping timeout", "no verification service after", "closing N session")


def read_kv_slots(port: int) -> int | None:
    """A replica's specwire_kv_cache_slots from its /metrics (None when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    return next((int(float(line.split()[-1])) for line in text.splitlines()
                 if line.startswith("specwire_kv_cache_slots ")), None)


def read_proc(pid: int) -> tuple[int, int] | None:
    """(RSS bytes, open file descriptors) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as status:
            rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None


class ClientLog(logging.Handler):
    """Counts the clients' warnings and errors by kind (this process's loggers)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.kinds: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.kinds[f"client {record.levelname.lower()}: {log_kind(record.getMessage())}"] += 1


class Soak:
    def __init__(self, args: argparse.Namespace, work_dir: Path):
        self.args = args
        self.work_dir = work_dir
        self.deadline = 0.0
        self.started = 0.0
        self.lock = threading.Lock()
        self.replies = self.lost = self.differing = self.offline_tokens = self.tokens = 0
        self.gaps: list[float] = []  # reconnect gaps seen by replies
        self.link_down: list[float] = []
        self.samples: list[dict] = []
        self.kills: list[dict] = []
        self.client_errors: Counter[str] = Counter()
        self.stop = threading.Event()

    # ---- the clients ------------------------------------------------------------------------

    def client(self, number: int, url: str, draft: DraftModel, prompts: list[list[int]],
               references: list[list[int]]) -> None:
        down_since: list[float] = []

        def on_state(state: LinkState) -> None:
            if not state.connected and not down_since:
                down_since.append(time.monotonic())
            elif state.connected and down_since:
                with self.lock:
                    self.link_down.append(time.monotonic() - down_since.pop())

        link = None
        try:
            link = ServiceLink(url, draft.hello(SamplingParams(), client=f"soak-{number}"), on_state=on_state,
                               takeover_wait_s=TAKEOVER_WAIT_S)
            speculator = StreamSpeculator(draft, link, SamplingParams())
            turn = number
            while time.monotonic() < self.deadline:
                index = turn % len(prompts)
                turn += 1
                self.reply(link, speculator, prompts[index], references[index])
        except Exception as exc:  # the link itself could not be made: every reply of this client is lost
            log.exception("client %d failed", number)
            with self.lock:
                self.client_errors[f"{type(exc).__name__}: {log_kind(str(exc))}"] += 1
                self.lost += 1
        finally:
            if link is not None:
                link.close()

    def reply(self, link: ServiceLink, speculator: StreamSpeculator, prompt: list[int], reference: list[int]) -> None:
        last = [time.monotonic(), link.connections]
        offline = [0]
        gaps: list[float] = []

        def on_commit(tokens: list[int], provenance: list[str]) -> None:
            now = time.monotonic()
            offline[0] += provenance.count("offline")
            if link.connections != last[1]:  # the first tokens on a new connection
                gaps.append(now - last[0])
            last[0], last[1] = now, link.connections

        try:
            result = speculator.generate(prompt, len(reference), on_commit)
        except Exception as exc:
            log.warning("a reply was lost: %s", exc)
            with self.lock:
                self.lost += 1
                self.client_errors[f"{type(exc).__name__}: {log_kind(str(exc))}"] += 1
            return
        with self.lock:
            self.replies += 1
            self.tokens += len(result.token_ids)
            self.offline_tokens += offline[0]
            self.gaps.extend(gaps)
            if result.token_ids == reference:
                return
            if result.token_ids == reference[:len(result.token_ids)]:  # right, but it stopped short
                self.lost += 1
            else:
                self.differing += 1

    # ---- faults and watching ------------------------------------------------------------------

    def killer(self, pool: ReplicaPool) -> None:
        """Stop one replica every --kill-every seconds (SIGKILL, then SIGTERM, in turn) and start it again."""
        stoppable = pool.replicas[:-1] or pool.replicas
        n = 0
        while not self.stop.wait(self.args.kill_every):
            replica = stoppable[n % len(stoppable)]
            sig = signal.SIGKILL if n % 2 == 0 else signal.SIGTERM
            began = time.monotonic()
            replica.stop(sig)
            stopped = time.monotonic()
            try:
                replica.start()
            except RuntimeError as exc:
                log.error("%s", exc)
            self.kills.append({"at_s": round(began - self.started, 1), "replica": pool.replicas.index(replica) + 1,
                               "signal": sig.name, "stop_s": round(stopped - began, 2),
                               "restart_s": round(time.monotonic() - stopped, 2)})
            log.info("replica %d: %s, back after %.1f s", pool.replicas.index(replica) + 1, sig.name,
                     time.monotonic() - began)
            n += 1

    def sampler(self, pool: ReplicaPool) -> None:
        last_progress = time.monotonic()
        while True:
            self.sample(pool)
            if time.monotonic() - last_progress >= 60:
                last_progress = time.monotonic()
                with self.lock:
                    log.info("%.0f min: %d replies, %d lost, %d differing, %d reconnects",
                             (last_progress - self.started) / 60, self.replies, self.lost, self.differing,
                             len(self.gaps))
            if self.stop.wait(self.args.sample_every):
                return

    def sample(self, pool: ReplicaPool, label: str = "") -> None:
        now = round(time.monotonic() - self.started, 1)
        for number, replica in enumerate(pool.replicas, 1):
            pid = replica.pid
            read = read_proc(pid) if pid else None
            if read:
                self.samples.append({"t_s": now, "replica": number, "pid": pid, "rss_mib": round(read[0] / 2**20, 1),
                                     "open_files": read[1], "kv_slots": read_kv_slots(replica.port),
                                     "age_s": round(time.monotonic() - replica.started_at, 1),
                                     **({"label": label} if label else {})})

    # ---- the run --------------------------------------------------------------------------------

    def run(self) -> dict:
        args = self.args
        tiny = build_tiny_models(self.work_dir / "tiny", seed=0)
        client_log = ClientLog()
        logging.getLogger().addHandler(client_log)
        with ReplicaPool(tiny.target_gguf, args.replicas, self.work_dir / "replicas",
                         extra_args=["--max-sessions", str(max(64, 4 * args.clients))]) as pool:
            drafts = [DraftModel(tiny.draft, n_ctx=2048, n_threads=1) for _ in range(args.clients)]
            prompts = [drafts[0].tokenize(text) for text in PROMPTS]
            references = reference_continuations(f"ws://127.0.0.1:{pool.replicas[-1].port}", drafts[0], prompts,
                                                 args.tokens)
            proxy = subprocess.Popen(
                [SPECWIRE, "proxy", "--upstream", pool.url, "--rtt-ms", str(args.rtt_ms), "--jitter-ms",
                 str(args.jitter_ms), "--disconnect-every", str(args.disconnect_every), "--seed", str(args.seed),
                 "--stall-every", str(args.stall_every), "--stall-s", str(args.stall_s),
                 "--bandwidth-kbps", str(args.bandwidth_kbps)],
                stdout=subprocess.PIPE, stderr=open(self.work_dir / "proxy.log", "w"), text=True)
            try:
                line = proxy.stdout.readline()
                if not line.startswith("relaying "):
                    raise RuntimeError(f"the proxy did not start: {line!r}")
                url = line.split()[1]
                self.started = time.monotonic()
                self.sample(pool, "start")
                watch = [threading.Thread(target=self.sampler, args=(pool,), daemon=True),
                         threading.Thread(target=self.killer, args=(pool,), daemon=True)]
                for thread in watch:
                    thread.start()
                self.deadline = self.started + args.minutes * 60
                clients = [threading.Thread(target=self.client, args=(i, url, drafts[i], prompts, references),
                                            daemon=True) for i in range(args.clients)]
                for thread in clients:
                    thread.start()
                try:
                    for thread in clients:
                        thread.join()
                finally:
                    self.deadline = 0.0  # stopped early (SIGTERM): the clients end after their reply
                wall_s = time.monotonic() - self.started
                self.stop.set()
                for thread in watch:
                    thread.join()
                time.sleep(5)  # the sessions' closes reach the replicas
                self.sample(pool, "end")
            finally:
                proxy.terminate()
                proxy.wait()
            logging.getLogger().removeHandler(client_log)
            service_errors = self.service_errors(pool)
        return self.report(wall_s, service_errors, client_log.kinds)

    def service_errors(self, pool: ReplicaPool) -> Counter[str]:
        kinds: Counter[str] = Counter()
        for replica in pool.replicas:
            for line in replica.log_path.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    if line.strip():
                        kinds[f"service text: {log_kind(line)}"] += 1  # not a JSON log line (a crash's traceback)
                    continue
                if entry.get("level") in ("warning", "error", "critical"):
                    kinds[f"service {entry['level']}: {log_kind(entry.get('message', ''))}"] += 1
        haproxy_log = pool.work_dir / "haproxy.log"  # its checks' verdicts: a replica down, up again
        for line in haproxy_log.read_text(errors="replace").splitlines() if haproxy_log.exists() else []:
            words = line.split(", reason: ")
            kinds[f"haproxy: {log_kind(words[0].split(') : ')[-1])}"
                  + (f", {' '.join(words[1].split()[:2])}" if len(words) > 1 else "")] += 1
        return kinds

    def report(self, wall_s: float, service_errors: Counter[str], client_kinds: Counter[str]) -> dict:
        args = self.args
        watched = args.replicas if args.replicas > 0 else 1  # the replica never stopped
        mine = [s for s in self.samples if s["replica"] == watched]
        after_minute = next((s for s in mine if s["age_s"] >= 60), mine[0] if mine else None)
        start = next((s for s in mine if s.get("label") == "start"), None)
        end = next((s for s in mine if s.get("label") == "end"), None)
        loaded = [s for s in mine if not s.get("label")]
        last_loaded = loaded[-1] if loaded else None  # the last sample while the clients ran
        # A KV pool grows with the sessions a replica holds (after a kill, all of them) and keeps its
        # size until they fall to a quarter: set the last sample against the first one after the
        # first minute with pools of the same size, so growth means memory the pools do not explain.
        same_kv = next((s for s in loaded if s["age_s"] >= 60 and last_loaded
                        and s.get("kv_slots") == last_loaded.get("kv_slots")), None)
        errors = service_errors + client_kinds + self.client_errors
        unplanned = {kind: n for kind, n in errors.items() if not any(p in kind for p in PLANNED)}
        return {
            "config": {"minutes": args.minutes, "clients": args.clients, "replicas": args.replicas,
                       "kill_every_s": args.kill_every, "tokens": args.tokens, "rtt_ms": args.rtt_ms,
                       "jitter_ms": args.jitter_ms, "disconnect_every_s": args.disconnect_every, "seed": args.seed,
                       "stall_every_s": args.stall_every, "stall_s": args.stall_s,
                       "bandwidth_kbps": args.bandwidth_kbps,
                       "models": "tiny (models/tiny.py)", "takeover_wait_s": TAKEOVER_WAIT_S},
            "wall_s": round(wall_s, 1),
            "replies": self.replies, "lost": self.lost, "differing": self.differing,
            "offline_tokens": self.offline_tokens, "tokens_per_s": round(self.tokens / wall_s, 1),
            "reconnects": len(self.gaps), "reconnect_p99_s": round(percentiles(self.gaps)["p99"], 3),
            "reconnect_s": {k: round(v, 3) for k, v in percentiles(self.gaps).items()}
            | {"max": round(max(self.gaps, default=0.0), 3)},
            "link_down_s": {k: round(v, 3) for k, v in percentiles(self.link_down).items()}
            | {"n": len(self.link_down), "max": round(max(self.link_down, default=0.0), 3)},
            "kills": self.kills,
            "rss_mib_after_first_minute": after_minute["rss_mib"] if after_minute else None,
            "rss_mib_last_under_load": last_loaded["rss_mib"] if last_loaded else None,
            "rss_mib_end": end["rss_mib"] if end else None,
            # under load, the last sample over the first minute's; and once the clients have gone
            "rss_growth": (round(last_loaded["rss_mib"] / after_minute["rss_mib"] - 1, 4)
                           if last_loaded and after_minute else None),
            "kv_slots_after_first_minute": after_minute.get("kv_slots") if after_minute else None,
            "kv_slots_last_under_load": last_loaded.get("kv_slots") if last_loaded else None,
            "rss_growth_same_kv": (round(last_loaded["rss_mib"] / same_kv["rss_mib"] - 1, 4)
                                   if same_kv and last_loaded else None),
            "rss_same_kv_since_s": same_kv["t_s"] if same_kv else None,
            "rss_growth_idle": round(end["rss_mib"] / after_minute["rss_mib"] - 1, 4) if end and after_minute else None,
            "open_files_start": start["open_files"] if start else None,
            "open_files_end": end["open_files"] if end else None,
            "errors_by_kind": dict(errors.most_common()),
            "unplanned_errors": unplanned,
            "samples": self.samples,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--tokens", type=int, default=48, help="tokens a reply (default: %(default)s)")
    parser.add_argument("--rtt-ms", type=float, default=40.0)
    parser.add_argument("--jitter-ms", type=float, default=20.0)
    parser.add_argument("--disconnect-every", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("--stall-every", type=float, default=0.0, metavar="SECONDS",
                        help="stall each connection this often on average (default: never)")
    parser.add_argument("--stall-s", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--bandwidth-kbps", type=float, default=0.0)
    parser.add_argument("--sample-every", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.replicas < 1 or args.minutes <= 0 or args.kill_every <= 0:
        parser.error("--clients and --replicas must be 1 or more, --minutes and --kill-every more than 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("local_draft", "app", "websockets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # a SIGTERM stops the run as an error would: the replicas, HAProxy and the proxy are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="specwire-soak-"))
    report = Soak(args, work_dir).run()
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["lost"] == 0 and report["differing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
