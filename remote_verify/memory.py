"""The service's memory: what it may still take, and handing freed memory back after a session closes.

A session's KV cache is a few large allocations. glibc keeps freed heap memory for reuse
and, after the first large frees, serves large allocations from the heap instead of fresh
mappings, so without a trim a service's resident memory only ever grows to its busiest
moment. `malloc_trim(0)` returns the free pages; where there is no glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)


def _load_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): the allocator decides alone
        return None


_malloc_trim = _load_trim()


def give_back_free_memory() -> bool:
    """Return free heap pages to the OS; True if the allocator released any."""
    if _malloc_trim is None:
        return False
    return bool(_malloc_trim(0))


GIB = 1 << 30
# Kept free when a KV pool is allocated: the rest of the service (logits rows, frames, Python)
# and the pool's own compute buffers grow too, and on Linux an allocation past the machine's
# memory does not fail: it succeeds, and the kernel's OOM killer ends the whole service later.
ALLOCATION_HEADROOM = 512 << 20


def available_memory_bytes() -> int | None:
    """The memory this process may still take: the least of the machine's available memory and
    what its cgroup's limit leaves (v2 or v1); None where neither is known (not Linux)."""
    found = []
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as limit, open(usage_file) as usage:
                text = limit.read().strip()
                if text != "max" and int(text) < 1 << 60:  # v1 writes "no limit" as a huge number
                    found.append(max(0, int(text) - int(usage.read().strip())))
        except (OSError, ValueError):
            continue
    return min(found) if found else None


def kv_memory_problem(backend, max_sessions: int) -> str | None:
    """Why `max_sessions` KV caches of the backend's context would not fit the memory the service
    can have (checked at start: otherwise the OOM killer finds out, sessions later), or None.
    Backends that state no KV size, or keep it on a GPU, are not checked here."""
    per_session = getattr(backend, "kv_bytes_per_session", None)
    if per_session is None or not str(getattr(backend, "name", "")).endswith(":cpu"):
        return None
    available = available_memory_bytes()
    if available is None:
        return None
    each = per_session()
    need = max_sessions * each
    if need <= available:
        return None
    return (f"--max-sessions {max_sessions} x --max-context {backend.max_context} need {need / GIB:.1f} GiB of KV "
            f"memory ({each / (1 << 20):.0f} MiB a session), and this service can have {available / GIB:.1f} GiB "
            f"more: lower --max-sessions (at most {available // each} fit) or --max-context")


def allocation_problem(nbytes: int, what: str) -> str | None:
    """Why allocating `nbytes` more now would take memory this service cannot have (ALLOCATION_HEADROOM
    kept free), or None; None too where the free memory is not known (not Linux)."""
    available = available_memory_bytes()
    if available is None or nbytes + ALLOCATION_HEADROOM <= available:
        return None
    return (f"{what} needs {nbytes / GIB:.2f} GiB, and this service can have {available / GIB:.2f} GiB more "
            f"({ALLOCATION_HEADROOM >> 20} MiB of which it keeps free)")
