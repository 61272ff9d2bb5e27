"""The run's CPU slots (tests/cpu_slots.py) and the forked seeds that take them (tests/forked_seeds.py)."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
import uuid

import pytest

from tests import cpu_slots
from tests.forked_seeds import map_seeds

SLOTS = 2


@pytest.fixture
def run_of_two_slots(monkeypatch):
    """A run of its own (a fresh xdist run id) with two slots, whatever this machine's cores."""
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")
    monkeypatch.setattr(cpu_slots, "_cores", lambda: SLOTS)
    cpu_slots.give_up()  # this test's own slot is the real run's, not this run's (not taken again:
    # the environment is still this run's at teardown; the suite's hook gives up what is held)


def _hold_a_slot(holding, most, lock, half: bool, at_once: int) -> None:
    """Hold a slot until `at_once` processes hold one (10 s at most: a machine busy with the rest of
    the suite may start them far apart), then a little longer, so that one too many would get in."""
    with cpu_slots.slot(half=half):
        with lock:
            holding.value += 1
            most.value = max(most.value, holding.value)
        deadline = time.monotonic() + 10
        while holding.value < at_once and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        with lock:
            holding.value -= 1


@pytest.mark.parametrize("half, at_once", [(False, SLOTS), (True, 2 * SLOTS)])
def test_no_more_processes_hold_slots_at_once_than_there_are_slots(run_of_two_slots, half, at_once):
    """Eight processes wanting a slot at once: two hold one at a time (four, half slots), and every
    one gets its turn."""
    fork = multiprocessing.get_context("fork")
    holding, most, lock = fork.Value("i", 0), fork.Value("i", 0), fork.Lock()
    processes = [fork.Process(target=_hold_a_slot, args=(holding, most, lock, half, at_once))
                 for _ in range(8)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0] * 8
    assert most.value == at_once, most.value


def test_a_whole_slot_waits_for_both_halves(run_of_two_slots):
    """With one half of each slot taken, a whole slot cannot be had until a whole slot is free."""
    directory = cpu_slots._directory()
    halves = [cpu_slots._lock(os.path.join(directory, f"slot-{i}-1")) for i in range(SLOTS)]
    assert None not in halves
    fork = multiprocessing.get_context("fork")
    taker = fork.Process(target=cpu_slots.take)
    taker.start()
    taker.join(0.5)
    assert taker.is_alive(), "a whole slot was taken while every slot had a half held"
    cpu_slots._unlock(halves[0])
    taker.join(30)
    cpu_slots._unlock(halves[1])
    assert taker.exitcode == 0


def test_a_slot_held_by_a_process_that_died_is_free_again(run_of_two_slots):
    """A crashed holder cannot leave its slot taken: the kernel drops its lock."""
    fork = multiprocessing.get_context("fork")
    for _ in range(SLOTS):
        child = fork.Process(target=lambda: (cpu_slots.take(), os._exit(1)))
        child.start()
        child.join(30)
    started = time.monotonic()
    with cpu_slots.slot():
        pass
    assert time.monotonic() - started < 5


def _seeds_and_pid(seeds: range) -> list[tuple[int, int]]:
    return [(seed, os.getpid()) for seed in seeds]


def test_forked_chunks_come_back_in_seed_order_from_several_processes(run_of_two_slots):
    results = map_seeds(_seeds_and_pid, range(100, 1100), workers=3)
    assert [seed for seed, _ in results] == list(range(100, 1100))
    assert len({pid for _, pid in results}) > 1  # the chunks were shared out
    assert os.getpid() not in {pid for _, pid in results}


def _fails_at_500(seeds: range) -> list[int]:
    if 500 in seeds:
        raise ValueError("seed 500")
    return list(seeds)


def test_a_failing_chunk_fails_the_map_and_says_why(run_of_two_slots):
    with pytest.raises(AssertionError, match="seed 500"):
        map_seeds(_fails_at_500, range(0, 1000), workers=2)


def test_a_run_long_over_leaves_no_directory_behind(run_of_two_slots):
    """A run's lock files go with the first run that starts a day after it."""
    runs = os.path.join(tempfile.gettempdir(), "specwire-cpu-slots")
    over, recent = os.path.join(runs, f"test-over-{uuid.uuid4().hex}"), os.path.join(runs, f"test-recent-{uuid.uuid4().hex}")
    for path in (over, recent):
        os.makedirs(path)
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(over, (two_days_ago, two_days_ago))
    cpu_slots._directory()
    assert not os.path.exists(over)
    assert os.path.exists(recent)
    os.rmdir(recent)
