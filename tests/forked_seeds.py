"""A statistical test's seeds, split over forked processes, one per core.

A sampled generation decides its tokens from its seed alone (wire/randomness.py): which process
runs a seed changes nothing a tally counts. A statistical case draws thousands of such
generations one after another, each a few round trips through a real service in this process,
where the client, the event loop and the device thread take turns on one interpreter lock: on
two cores one of them stood idle. Here the seeds are cut into consecutive chunks, and each child
takes the next chunk in turn and runs it against a service of its own (built by the job, over the
backend the parent loaded); the parent gathers the generations in seed order.

Forked, not spawned: a child starts with the parent's loaded models and with whatever a test
planted (monkeypatch) in the service's code, so a planted bug runs in every child as it would in
one process. The models run on one thread each (tests/conftest.py TINY_THREADS), which a
forked child may use; the parent's own services stay idle while it waits.

The suite runs on one pytest-xdist worker per core (pyproject.toml). A case forks a process per
core, and each runs a chunk only in a CPU slot of the run's (tests/cpu_slots.py), which the
case's worker gives up while it waits: beside another worker's test a case runs on the core left,
alone it has them all, and two cases at once never run four busy processes on two cores (which
cost each generation a quarter more CPU than two).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import traceback
from typing import Callable, Iterator, Sequence

from tests import cpu_slots

Job = Callable[[range], Sequence]  # a share of the seeds -> one picklable result per seed
CHILD_TIMEOUT_S = 900.0  # the suite's own per-test limit: a child that hangs fails the test with its share


CHUNKS_PER_PROCESS = 8  # a case's seeds go out in chunks, taken in turn: a process held back (no free
# CPU slot, tests/cpu_slots.py) leaves its chunks to the others instead of finishing last


def _chunks(seeds: range, workers: int) -> list[range]:
    """Consecutive, nearly equal chunks of `seeds`, CHUNKS_PER_PROCESS per worker (fewer for few seeds)."""
    step = max(1, -(-len(seeds) // (workers * CHUNKS_PER_PROCESS)))
    return [seeds[i:i + step] for i in range(0, len(seeds), step)]


def _child(job: Job, chunks: list[range], next_chunk, paced: bool, conn) -> None:
    """Take chunks in turn (a shared counter), each in a CPU slot (half of one, `paced`); send back
    (chunk index, results) pairs."""
    cpu_slots.forget_inherited()
    done = []
    try:
        while True:
            with cpu_slots.slot(half=paced):
                with next_chunk.get_lock():
                    index = next_chunk.value
                    next_chunk.value += 1
                if index >= len(chunks):
                    break
                done.append((index, list(job(chunks[index]))))
        conn.send(("ok", done))
    except BaseException:  # everything goes back to the parent, which fails the test with it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _default_workers(paced: bool) -> int:
    """One process per core (two, `paced`): under pytest-xdist the CPU slots (tests/cpu_slots.py) keep
    them, the other workers' tests and the other cases' processes to one busy process per core."""
    return len(os.sched_getaffinity(0)) * (2 if paced else 1)


def map_seeds(job: Job, seeds: range, workers: int | None = None, paced: bool = False) -> list:
    """`job` over `seeds`, split among `workers` forked processes (default: `_default_workers`), which
    take consecutive chunks of the seeds in turn; the results of every chunk, concatenated in seed
    order. With one worker the job runs here, in one call. `paced`: the job's service holds every
    pass to a GPU's time (tests/conftest.py `paced_running_service`), and its processes sleep about
    half their time: two share a core."""
    workers = min(workers or _default_workers(paced), len(seeds))
    if workers <= 1:
        return list(job(seeds))
    fork = multiprocessing.get_context("fork")
    chunks = _chunks(seeds, workers)
    next_chunk = fork.Value("i", 0)
    by_chunk: dict[int, list] = {}
    with cpu_slots.given_up():  # this process only waits: its slot goes to its children
        running = []
        for _ in range(workers):
            receive, send = fork.Pipe(duplex=False)
            child = fork.Process(target=_child, args=(job, chunks, next_chunk, paced, send), daemon=True)
            child.start()
            send.close()  # the child holds the sending end: a dead child reads as end of file here
            running.append((child, receive))
        try:
            for child, receive in running:
                if not receive.poll(CHILD_TIMEOUT_S):
                    raise AssertionError(f"seeds {seeds.start}..{seeds.stop - 1}: a process gave no result "
                                         f"within {CHILD_TIMEOUT_S:g} s")
                try:
                    status, payload = receive.recv()
                except EOFError:
                    child.join(5)
                    raise AssertionError(f"seeds {seeds.start}..{seeds.stop - 1}: a process died "
                                         f"(exit code {child.exitcode})") from None
                if status != "ok":
                    raise AssertionError(f"seeds {seeds.start}..{seeds.stop - 1}: a chunk failed:\n{payload}")
                by_chunk.update(payload)
        finally:
            for child, receive in running:
                receive.close()
                child.join(5)
                if child.is_alive():
                    child.kill()
    missing = [chunks[i] for i in range(len(chunks)) if i not in by_chunk]
    assert not missing, f"chunks never run: {missing}"
    return [result for i in range(len(chunks)) for result in by_chunk[i]]


@contextlib.contextmanager
def service_here(service) -> Iterator[str]:
    """The URL to reach `service` (a tests.conftest RunningService) from this process: its own in
    the process that started it; in a forked child, that of a service of the child's own over
    the same backend (the parent's service threads are not in the child, and a backend belongs
    to one device thread)."""
    if multiprocessing.parent_process() is None:
        yield service.url
        return
    from tests.conftest import RunningService

    own = RunningService(service.backend)
    try:
        yield own.url
    finally:
        own.close()


def reseeded_generations(service, hello, loop, prompt: list[int], max_tokens: int) -> Job:
    """A Job for map_seeds: on a session of its own (`hello`), the loop `loop(client)` makes (a
    Speculator or StreamSpeculator) re-keyed for each seed, one generation of `max_tokens` each."""
    from local_draft.verify_client import VerifyClient

    def job(seeds: range) -> list:
        with service_here(service) as url:
            client = VerifyClient(url, hello)
            speculator = loop(client)
            made = []
            for seed in seeds:
                speculator.reseed(seed)  # a seed decides a generation: each sample gets its own
                made.append(speculator.generate(prompt, max_tokens))
            client.close()
        return made

    return job
