"""The device queue: one worker thread, sessions served in turn, errors handed back."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from functools import partial

import pytest

from remote_verify.scheduler import DeviceQueue, QueueClosed


def test_a_busy_session_does_not_starve_the_others():
    """A session with 20 items queued and two sessions with one each: the two run after at most
    one more of the busy session's items, not after all twenty."""
    queue = DeviceQueue("test")
    order: list[str] = []
    gate = threading.Event()

    def work(name: str):
        gate.wait(5)  # hold the worker until everything is queued
        order.append(name)

    async def main():
        busy = [asyncio.ensure_future(queue.run("busy", lambda i=i: work(f"busy{i}"))) for i in range(20)]
        await asyncio.sleep(0.05)
        others = [asyncio.ensure_future(queue.run(name, lambda n=name: work(n))) for name in ("a", "b")]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*busy, *others)

    asyncio.run(main())
    queue.shutdown()
    assert len(order) == 22
    assert order.index("a") <= 2 and order.index("b") <= 3, order
    assert [n for n in order if n.startswith("busy")] == [f"busy{i}" for i in range(20)]  # FIFO within a session


def test_results_errors_and_queue_time_come_back_to_the_caller():
    """run() returns the work's result with the time it waited; an exception is raised in the caller."""
    queue = DeviceQueue("test")

    async def main():
        arrived = time.perf_counter() - 0.2  # the request reached the service 200 ms ago
        result, queued = await queue.run("s", lambda: 42, arrived=arrived)
        assert result == 42 and queued >= 0.2
        with pytest.raises(ZeroDivisionError):
            await queue.run("s", lambda: 1 / 0)
        worker_threads = set()
        for _ in range(3):
            await queue.run("s", lambda: worker_threads.add(threading.get_ident()))
        assert len(worker_threads) == 1 and threading.get_ident() not in worker_threads

    asyncio.run(main())
    queue.shutdown()

    async def after_shutdown():
        with pytest.raises(QueueClosed):
            await queue.run("s", lambda: None)

    asyncio.run(after_shutdown())


class _Request:
    """Stands for a decoded request (a weak reference tells when it is freed)."""


def test_a_refused_request_is_freed_without_waiting_for_the_garbage_collector():
    """Work that raises on the device thread: once the caller has handled the exception, the
    request, the exception and the future are freed by reference counting alone (no cycle
    through the traceback's frames), with the garbage collector off."""
    queue = DeviceQueue("test")
    freed: list[weakref.ref] = []

    class Refused(Exception):
        pass

    def refuse(request: _Request):
        raise Refused("no")

    async def main():
        for _ in range(3):
            request = _Request()
            freed.append(weakref.ref(request))
            try:
                await queue.run("s", partial(refuse, request))
            except Refused:
                pass
            del request
        await asyncio.sleep(0.05)  # the worker has gone back to waiting for work

    gc.collect()
    gc.disable()
    try:
        asyncio.run(main())
        alive = sum(ref() is not None for ref in freed)
    finally:
        gc.enable()
        queue.shutdown()
    assert alive == 0, f"{alive} of 3 refused requests still alive"
