"""A wave's users split over worker processes, so that no one interpreter runs hundreds of clients.

Each emulated user is a real client with a few threads (its stream, its drafts, its ping watch). In one
process, past a couple of hundred users, they queued for the interpreter: at 288 users and a time scale
of 18 the clients' ping watch cut 265 links whose pongs had waited three seconds for a turn, and what the
rest measured was partly their own waiting. Split over processes of at most USERS_PER_PROCESS users, the
machine's scheduler shares the cores between them as it does between any programs.

The parent keeps the latency proxy (its links to the service) and the clock: each worker builds its users
(benchmarks/emulated_users.py), connects them, says it is ready, and is told when to start, when the
measured window opens and when it ends, all as time.perf_counter values (one monotonic clock for every
process on the machine). Users are dealt out in turn, so every process holds users of every arrival time.
Each worker sends back its users' records, the links its ping watch cut, and how late its threads ran
(benchmarks/client_lag.py).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import threading
import time
from typing import Callable

from benchmarks.client_lag import ClientLag
from benchmarks.emulated_users import UserRecord, UserSetup, WatchCuts, run_user

USERS_PER_PROCESS = 64  # a wave of more users runs them in worker processes of at most this many
READY_TIMEOUT_S = 600.0  # a worker's users connected and waiting (a few hundred handshakes on two cores)
START_DELAY_S = 0.5  # from the last worker's ready to the start: time for every worker to hear it


def auto_processes(users: int) -> int:
    """Worker processes for a wave of `users` (1: the users run in the benchmark's own process, as they did
    up to USERS_PER_PROCESS users)."""
    return 1 if users <= USERS_PER_PROCESS else math.ceil(users / USERS_PER_PROCESS)


def run_in_processes(url: str, mode: str, users: int, setup: UserSetup, max_tokens: int, seconds: float,
                     warm_up: float, spread: float, busy_seconds: Callable[[], float], pace_s: float, think_s: float,
                     processes: int) -> tuple[list, tuple[float, float], float, int, list[float]]:
    """The wave's users in `processes` workers (every duration wall seconds); returns their records in the
    users' order, the window, the device's busy seconds in it, the links cut and the clients' lateness."""
    context = multiprocessing.get_context("spawn")  # not fork: this process runs the proxy's threads
    slices = [list(range(users))[p::processes] for p in range(processes)]
    workers = []
    try:
        for indices in slices:
            ours, theirs = context.Pipe()
            worker = context.Process(target=_worker, args=(theirs, setup, url, mode, indices, users, max_tokens,
                                                           spread, pace_s, think_s), daemon=True)
            worker.start()
            theirs.close()
            workers.append((worker, ours))
        for worker, pipe in workers:
            if not pipe.poll(READY_TIMEOUT_S):
                raise RuntimeError(f"a worker process's users did not connect within {READY_TIMEOUT_S:g} s")
            pipe.recv()
        start = time.perf_counter() + START_DELAY_S
        window = (start + warm_up, start + warm_up + seconds)
        for _, pipe in workers:
            pipe.send((start, *window))
        time.sleep(max(0.0, window[0] - time.perf_counter()))
        busy0 = busy_seconds()
        time.sleep(max(0.0, window[1] - time.perf_counter()))
        busy = busy_seconds() - busy0
        records: list = [None] * users
        cut, lateness = 0, []
        for indices, (worker, pipe) in zip(slices, workers):
            theirs_records, theirs_cut, theirs_lateness = pipe.recv()
            for index, record in zip(indices, theirs_records):
                records[index] = record
            cut += theirs_cut
            lateness += theirs_lateness
            worker.join(timeout=60)
        return records, window, busy, cut, lateness
    finally:
        for worker, pipe in workers:
            pipe.close()
            if worker.is_alive():
                worker.terminate()


def _worker(pipe, setup: UserSetup, url: str, mode: str, indices: list[int], users: int, max_tokens: int,
            spread: float, pace_s: float, think_s: float) -> None:
    """One worker: its users connect, wait for the parent's start, generate until the window ends."""
    with WatchCuts() as cuts:
        made = setup.load()
        records = [UserRecord() for _ in indices]
        start = threading.Barrier(len(indices) + 1)
        window = [0.0, float("inf")]
        threads = [threading.Thread(target=run_user, args=(i, mode, url, made.draft(), made.entries, max_tokens, start,
                                                           window, record, spread * i / users, pace_s, think_s),
                                    daemon=True)
                   for i, record in zip(indices, records)]
        lag = ClientLag().start()
        for thread in threads:
            thread.start()
        deadline = time.perf_counter() + READY_TIMEOUT_S
        while start.n_waiting < len(indices) and not start.broken and time.perf_counter() < deadline:
            time.sleep(0.05)  # every user connected (or one failed, and its record says why)
        pipe.send("ready")
        begin, window[0], window[1] = pipe.recv()
        time.sleep(max(0.0, begin - time.perf_counter()))
        try:
            start.wait(READY_TIMEOUT_S)
        except threading.BrokenBarrierError:
            logging.getLogger(__name__).warning("a user of this worker failed before the start")
        for thread in threads:
            thread.join()
        lag.stop()
    pipe.send((records, cuts.count, lag.within(window[0], window[1])))
    pipe.close()
