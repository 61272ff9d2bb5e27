"""The parts of a load run that benchmarks/load.py and benchmarks/attack.py share.

`specwire serve` in a child process (`Service`: its URL, /metrics and resident memory),
the prompts and each one's continuation by the target alone, and a wave of concurrent
sessions started together (`run_wave`), each generating greedily and checking every reply
against that reference, with each round's timing kept by `TimedClient`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from local_draft.draft_model import DraftModel
from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from wire.protocol import Hello, SamplingParams, Sync, Verify

PROMPTS = [  # short and varied: each session cycles through them from its own offset
    "def quicksort(arr):", "import numpy as np", "class Stack:", "for i in range(10):",
    "The quick brown fox", "SELECT name FROM", "#include <stdio.h>", "Once upon a time",
    "fn main() {", "<html><body>", "x = [1, 2, 3]", "while True:",
]
MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def percentiles(values: list[float], points=(50, 90, 99)) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {f"p{p}": 0.0 for p in points}
    return {f"p{p}": ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] for p in points}


def pin_to_one_cpu() -> None:
    """Run this process on one CPU, leaving the others to the clients: llama.cpp's threads wait
    for each other by spinning, and on an oversubscribed machine every forward pass pays for it.
    (A `preexec_fn` for the service's child process; Linux.)"""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[-1]})


class TimedClient(VerifyClient):
    """A client that keeps, per round, (round trip, time queued, service time).

    The speculator sends a round and receives its verdict in two calls (it may draft in
    between), so a round is timed from its send to its verdict.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.samples: list[tuple[float, float, float]] = []
        self._sent = 0.0

    def send_verify(self, request: Verify) -> None:
        self._sent = time.perf_counter()
        super().send_verify(request)

    def receive_verdict(self):
        verdict = super().receive_verdict()
        self.samples.append((time.perf_counter() - self._sent, verdict.queue_s, verdict.forward_s + verdict.accept_s))
        return verdict


@dataclass
class SessionResult:
    rounds: int = 0
    generations: int = 0
    tokens: int = 0  # in all its replies
    finished: float = 0.0  # time.perf_counter() when its last reply was done
    mismatches: list[str] = field(default_factory=list)
    error: str | None = None
    samples: list[tuple[float, float, float]] = field(default_factory=list)


class Service:
    """`specwire serve` in a child process."""

    def __init__(self, target: Path, backend: str, max_sessions: int, pinned: bool = False,
                 batch_tokens: int | None = None, extra_args: tuple[str, ...] = ()):
        batching = [] if batch_tokens is None else ["--batch-tokens", str(batch_tokens)]
        batching += list(extra_args)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--target", str(target), "--backend", backend,
             "--port", "0", "--max-sessions", str(max_sessions), *batching,
             "--exit-with-parent"],  # gone when we are
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=pin_to_one_cpu if pinned else None)
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.process.kill()
            raise RuntimeError(f"the service did not start: {line!r}")
        self.url = line.split()[-1]

    def metric(self, name: str) -> float:
        """One unlabelled sample from /metrics."""
        with urllib.request.urlopen(self.url.replace("ws://", "http://") + "/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise KeyError(name)

    def rss(self) -> int:
        return rss_bytes(self.process.pid)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def hello_for(draft: DraftModel) -> Hello:
    return draft.hello(SamplingParams(), client="benchmarks.load")


def reference_continuations(url: str, draft: DraftModel, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt continued by the target alone: k = 0 through the service."""
    client = VerifyClient(url, hello_for(draft))
    try:
        speculator = Speculator(draft, client, SamplingParams(), k=0)
        return [speculator.generate(prompt, max_tokens).token_ids for prompt in prompts]
    finally:
        client.close()


class ReplayedDrafts:
    """A drafter that costs the client nothing: each block is the reference's next k tokens with
    one of them (or none) changed, the position drawn per round, so that a round accepts 0 to k
    tokens (k on average / 2) while the service does all the work a real drafter's rounds ask
    of it. Isolates the service's capacity from the clients' drafting on a shared machine."""

    def __init__(self, client: VerifyClient, k: int, seed: int, vocab_size: int):
        self.client, self.k, self.vocab_size = client, k, vocab_size
        self.rng = random.Random(seed)
        self.seq = 0

    def generate(self, prompt: list[int], reference: list[int]) -> tuple[list[int], int]:
        """(the tokens the service committed after `prompt`, rounds)."""
        self.seq += 1
        self.client.sync(Sync(seq=self.seq, tokens=[]))  # each reply starts a fresh history
        out: list[int] = []
        rounds = 0
        while len(out) < len(reference):
            draft = list(reference[len(out):len(out) + self.k])
            wrong = self.rng.randrange(len(draft) + 1)  # == len(draft): the block is all right
            if wrong < len(draft):
                draft[wrong] = (draft[wrong] + 1) % self.vocab_size
            self.seq += 1
            verdict = self.client.verify(Verify(seq=self.seq, committed_len=len(prompt) + len(out) if out else 0,
                                                append=[] if out else list(prompt), draft=draft))
            out += draft[:verdict.accepted] + [verdict.token]
            rounds += 1
        return out[:len(reference)], rounds


def _run_session(index: int, url: str, draft: DraftModel, prompts: list[list[int]], references: list[list[int]],
                 rounds: int, k: int, max_tokens: int, start: threading.Barrier, result: SessionResult,
                 replay: bool = False) -> None:
    client = None
    try:
        client = TimedClient(url, hello_for(draft), stall_timeout_s=120.0)
        speculator = Speculator(draft, client, SamplingParams(), k=k)
        replayed = ReplayedDrafts(client, k, seed=index, vocab_size=draft.vocab_size)
        start.wait()
        while result.rounds < rounds:
            which = (index + result.generations) % len(prompts)
            if replay:
                token_ids, made_in = replayed.generate(prompts[which], references[which])
            else:
                generation = speculator.generate(prompts[which], max_tokens)
                token_ids, made_in = generation.token_ids, generation.stats.rounds
            result.rounds += made_in
            result.generations += 1
            result.tokens += len(token_ids)
            if token_ids != references[which]:
                result.mismatches.append(f"session {index}, prompt {which}: {token_ids} != "
                                         f"{references[which]}")
    except threading.BrokenBarrierError:
        result.error = f"session {index}: another session failed before the start"
    except Exception as exc:  # reported, never raised from a thread
        result.error = f"session {index}: {type(exc).__name__}: {exc}"
        start.abort()
    finally:
        result.finished = time.perf_counter()
        if client is not None:
            result.samples = client.samples
            client.close()


def run_wave(url: str, draft_path: Path, prompts, references, sessions: int, rounds: int, k: int,
             max_tokens: int, on_tick=None, replay: bool = False) -> tuple[list[SessionResult], float]:
    """`sessions` concurrent sessions, started together; returns their results and the wall time."""
    results = [SessionResult() for _ in range(sessions)]
    # Loaded here, one after another: llama-cpp-python silences a load by redirecting the
    # process's stdout and stderr, and loads racing on threads can leave them redirected.
    drafts = [DraftModel(draft_path, n_ctx=1024, n_threads=1) for _ in range(sessions)]  # many share 2 cores
    start = threading.Barrier(sessions + 1)
    threads = [threading.Thread(target=_run_session, daemon=True,
                                args=(i, url, drafts[i], prompts, references, rounds, k, max_tokens, start, results[i],
                                      replay))
               for i in range(sessions)]
    for thread in threads:
        thread.start()
    try:
        start.wait(120)
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    while any(thread.is_alive() for thread in threads):
        if on_tick is not None:
            on_tick()
        time.sleep(0.05)
    return results, max(result.finished for result in results) - began  # not rounded to the 50 ms ticks


def wait_until_closed(service: Service, timeout_s: float = 30.0) -> float:
    """Wait for the service to report no open session and no KV cache slot held; returns the session
    count it last reported. A session leaves the count when its close is queued, and its cache is
    freed on the device thread in its turn after that: memory read between the two still holds
    pools (once, on a busy machine, 26 MiB above the start after the tiny target's 32 sessions)."""
    deadline = time.monotonic() + timeout_s
    while (open_now := service.metric("specwire_sessions_open")) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    while service.metric("specwire_kv_cache_slots") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return open_now
