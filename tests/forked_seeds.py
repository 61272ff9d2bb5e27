"""A statistical test's seeds, split over forked processes, one per core the test may use.

A sampled generation decides its tokens from its seed alone (wire/randomness.py): which process
runs a seed changes nothing a tally counts. A statistical case draws thousands of such
generations one after another, each a few round trips through a real service in this process,
where the client, the event loop and the device thread take turns on one interpreter lock: on
two cores one of them stood idle. Here each child runs a consecutive share of the seeds against
a service of its own (built by the job, over the backend the parent loaded), and the parent
gathers the generations in seed order.

Forked, not spawned: a child starts with the parent's loaded models and with whatever a test
planted (monkeypatch) in the service's code, so a planted bug runs in every child as it would in
one process. The models run on one thread each (tests/conftest.py TINY_THREADS), which a
forked child may use; the parent's own services stay idle while it waits.

The suite itself runs on one pytest-xdist worker per core (pyproject.toml). A case still forks
two processes on two cores: a case left running at the end of a run then has both. (One process
per worker, tried, made a full run no faster: 23 min 56 s against 23 min 36 s, each alone on the
machine, since the worker holding the longest cases then ran them on one core.)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import traceback
from typing import Callable, Iterator, Sequence

Job = Callable[[range], Sequence]  # a share of the seeds -> one picklable result per seed
CHILD_TIMEOUT_S = 900.0  # the suite's own per-test limit: a child that hangs fails the test with its share


def _shares(seeds: range, workers: int) -> list[range]:
    """Consecutive, nearly equal shares of `seeds`, one per worker."""
    step = -(-len(seeds) // workers)
    return [seeds[i:i + step] for i in range(0, len(seeds), step)]


def _child(job: Job, share: range, conn) -> None:
    try:
        conn.send(("ok", list(job(share))))
    except BaseException:  # everything goes back to the parent, which fails the test with it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _default_workers() -> int:
    """One process per core, shared with the suite's other pytest-xdist workers; at least two
    where there are two cores, so that a case left running alone at the end of a run still has
    both (a statistical case beside another test only slows that test down, not the suite)."""
    cores = len(os.sched_getaffinity(0))
    suite_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(min(2, cores), cores // suite_workers)


def map_seeds(job: Job, seeds: range, workers: int | None = None) -> list:
    """`job` over `seeds`, split among `workers` forked processes (default: `_default_workers`);
    the results of every share, concatenated in seed order. With one worker the job runs here."""
    workers = min(workers or _default_workers(), len(seeds))
    if workers <= 1:
        return list(job(seeds))
    fork = multiprocessing.get_context("fork")
    running = []
    for share in _shares(seeds, workers):
        receive, send = fork.Pipe(duplex=False)
        child = fork.Process(target=_child, args=(job, share, send), daemon=True)
        child.start()
        send.close()  # the child holds the sending end: a dead child reads as end of file here
        running.append((share, child, receive))
    results = []
    try:
        for share, child, receive in running:
            if not receive.poll(CHILD_TIMEOUT_S):
                raise AssertionError(f"seeds {share.start}..{share.stop - 1}: no result within {CHILD_TIMEOUT_S:g} s")
            try:
                status, payload = receive.recv()
            except EOFError:
                child.join(5)
                raise AssertionError(f"seeds {share.start}..{share.stop - 1}: the process died "
                                     f"(exit code {child.exitcode})") from None
            if status != "ok":
                raise AssertionError(f"seeds {share.start}..{share.stop - 1} failed:\n{payload}")
            results.extend(payload)
    finally:
        for _, child, receive in running:
            receive.close()
            child.join(5)
            if child.is_alive():
                child.kill()
    return results


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
