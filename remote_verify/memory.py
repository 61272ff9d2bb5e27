"""Handing freed memory back to the operating system after a session closes.

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
