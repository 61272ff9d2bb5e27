"""How much of the CPU the device thread yields to the service's event loop: `serve --device-nice`.

The device thread runs every forward pass, and the compute threads llama.cpp starts from it
inherit its priority. Where the service has one core to itself, its event loop (reading
frames, answering pings, sending verdicts) waits behind those passes for its turn on that
core: under four clients thrashing 4,095-token Syncs an honest round's time outside the queue
reached 5 ms at p99, against 1.5 ms quiet, with the queue itself fair. A device thread made
nicer than the loop lets the loop in as soon as a frame arrives (nice +5: the round trip's p99
1.06x and 0.78x quiet's, against 1.85x to 2.54x; `docs/results.md`, Sync thrash).

Linux sets a thread's niceness by its thread id. Elsewhere that call would name a process,
so the setting is refused with a warning there. The default is 0: a nicer device thread
also yields to every other program on the machine (the user's own drafter among them when
both share a laptop), a trade the README flow has not been measured with.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MOST_NICE = 19  # the kernel's range


def check_device_nice(value: int) -> int:
    """`value` if it is a niceness the device thread can be lowered by; ValueError saying why not."""
    if not 0 <= value <= MOST_NICE:
        raise ValueError(f"the device thread's niceness is 0 (as the service) to {MOST_NICE} (yield the most), "
                         f"got {value}")
    return value


def lower_this_thread(by: int) -> bool:
    """Make the calling thread, and threads it starts from now on, `by` nicer; False (logged) where
    it cannot be done. Never raises: the service works without it."""
    if by <= 0:
        return False
    if sys.platform != "linux":
        log.warning("--device-nice works on Linux only: the device thread keeps the service's priority")
        return False
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(MOST_NICE, os.getpriority(os.PRIO_PROCESS, thread) + by))
    except OSError as exc:
        log.warning("cannot make the device thread nicer by %d: %s", by, exc)
        return False
    log.info("the device thread runs at nice %d", os.getpriority(os.PRIO_PROCESS, thread))
    return True
