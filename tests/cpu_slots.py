"""A test run's CPU slots: one per core, shared by every pytest-xdist worker and by the processes
a statistical case forks, so that no more of the suite's work runs at once than there are cores.

Without them, two workers each running a statistical case ran four busy processes on two cores,
and a generation then cost 26% more CPU than with two (5.8 ms against 4.6, the seeded case,
measured side by side): each process's client, event loop and device thread hand the interpreter
lock to one another a few times a round, and a process descheduled in between stalls all three.

A worker holds a slot while it runs a test (tests/conftest.py). A case that forks its seeds out
(tests/forked_seeds.py) gives its worker's slot up while it waits, and each child takes a slot for
each chunk of seeds it runs, so a case uses every core the other worker leaves free, and no more.

A slot is a pair of locks (flock) on files in a directory of the run's own (keyed by xdist's run
id, under the temporary directory's specwire-cpu-slots, where runs a day old are removed): the
kernel frees a lock when its holder dies, so a crashed process cannot leave a slot taken.
A case whose processes sleep through a paced service's passes takes half slots: two to a core.
Outside xdist (one process) there are no slots: taking one returns at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from typing import Iterator

POLL_S = 0.005  # how often a process waiting for a slot tries the slots again
YIELD_S = 0.02  # after giving a slot up, how long before taking one again: a waiting poller gets its turn

_held: list[int] = []  # this process's locks (file descriptors): both halves of a slot, or one


STALE_S = 24 * 3600  # a run's directory this old is from a run long over (a run takes minutes)
_made: set[str] = set()  # the run directories this process has made (or found) already


def _directory() -> str | None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    runs = os.path.join(tempfile.gettempdir(), "specwire-cpu-slots")
    path = os.path.join(runs, run)
    if path not in _made:
        os.makedirs(path, exist_ok=True)
        _made.add(path)
        _remove_stale(runs, keep=run)
    return path


def _remove_stale(runs: str, keep: str) -> None:
    """Remove the directories of runs long over (each leaves its few empty lock files behind)."""
    now = time.time()
    for entry in os.scandir(runs):
        try:
            if entry.name != keep and now - entry.stat().st_mtime > STALE_S:
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:  # another process removed it first
            continue


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _lock(name: str) -> int | None:
    fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def take(half: bool = False) -> None:
    """Wait for a free slot and hold it (nothing, outside xdist or when one is held already).

    `half`: half a slot, for a process that sleeps about half its time (a client of a service paced
    like a GPU, which waits out every pass): two of them share a core. A whole slot is both halves of
    one, locked only when both are free, so that no process ever waits holding a half."""
    directory = _directory()
    if directory is None or _held:
        return
    halves = [[os.path.join(directory, f"slot-{i}-{j}") for j in (0, 1)] for i in range(_cores())]
    while True:
        for pair in halves:
            if half:
                for name in pair:
                    fd = _lock(name)
                    if fd is not None:
                        _held.append(fd)
                        return
                continue
            first = _lock(pair[0])
            if first is None:
                continue
            second = _lock(pair[1])
            if second is None:
                _unlock(first)
                continue
            _held.extend([first, second])
            return
        time.sleep(POLL_S)


def give_up() -> bool:
    """Free what this process holds; whether it held anything."""
    if not _held:
        return False
    while _held:
        _unlock(_held.pop())
    return True


def forget_inherited() -> None:
    """In a forked child: drop the parent's locks from this process's books without unlocking them (a
    child shares the parent's open files, whose locks are the parent's to free)."""
    while _held:
        os.close(_held.pop())


@contextlib.contextmanager
def slot(half: bool = False) -> Iterator[None]:
    """Hold a slot (or half of one) for the block; afterwards wait YIELD_S, so that a process polling
    for one gets it."""
    take(half)
    try:
        yield
    finally:
        if give_up():
            time.sleep(YIELD_S)


@contextlib.contextmanager
def given_up() -> Iterator[None]:
    """This process's slot freed for the block (its forked children take slots), taken again after."""
    held = give_up()
    try:
        yield
    finally:
        if held:
            take()
