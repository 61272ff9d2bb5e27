"""`serve --device-nice`: the device thread (and threads it starts) yields the CPU to the event loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.cli import build_parser
from remote_verify.scheduler import DeviceQueue

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a thread's niceness is set by its id on Linux only")


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _nice_inside(queue: DeviceQueue) -> tuple[int, int]:
    """The worker's niceness, and that of a thread the worker starts (as llama.cpp starts its compute threads)."""
    def work() -> tuple[int, int]:
        started: list[int] = []
        child = threading.Thread(target=lambda: started.append(_nice_of_this_thread()))
        child.start()
        child.join()
        return _nice_of_this_thread(), started[0]

    async def run() -> tuple[int, int]:
        return (await queue.run("s", work))[0]

    try:
        return asyncio.run(run())
    finally:
        queue.shutdown()


@pytest.mark.parametrize("nice", [0, 5])
def test_the_device_thread_and_the_threads_it_starts_are_nicer_than_the_loop_by_the_setting(nice):
    """The worker runs `nice` above the caller (whose own niceness does not change), and so does a
    thread it starts."""
    before = _nice_of_this_thread()
    worker, started = _nice_inside(DeviceQueue("t", nice=nice))
    assert (worker, started) == (min(19, before + nice),) * 2
    assert _nice_of_this_thread() == before


def _thread_nices(pid: int) -> dict[int, int]:
    """Each thread of `pid` and its niceness (field 19 of /proc/PID/task/TID/stat)."""
    nices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
        nices[int(task.name)] = int(fields[16])
    return nices


def test_serve_runs_its_passes_nicer_and_its_event_loop_as_started(tiny):
    """A real `specwire serve --device-nice 5`: its main thread (the event loop) keeps the niceness
    it was started with; the device thread, which loaded the model, is 5 nicer, and says so."""
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "-v", "serve", "--target", str(tiny.target_gguf),
                                "--port", "0", "--device-nice", "5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # once the target is loaded
        assert line.startswith("listening on"), process.stderr.read() if process.poll() is not None else line
        nices = _thread_nices(process.pid)
    finally:
        process.terminate()
        log = process.communicate(timeout=30)[1]
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert nices[process.pid] == base, nices
    assert min(19, base + 5) in nices.values(), nices
    assert f"the device thread runs at nice {min(19, base + 5)}" in log, log


@pytest.mark.parametrize("value", ["20", "-1", "five"])
def test_a_device_niceness_out_of_range_is_refused_with_the_range(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "--device-nice", value])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--device-nice" in error and ("0 (as the service) to 19" in error or "not a whole number" in error), error


def test_the_device_niceness_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("SPECWIRE_DEVICE_NICE", "3")
    assert build_parser().parse_args(["serve"]).device_nice == 3
    assert build_parser().parse_args(["serve", "--device-nice", "0"]).device_nice == 0
