"""A loaded target belongs to one service: its device thread alone touches the model's caches.

A backend's KV caches are state the device thread changes between passes: llama.cpp's KV pools
grow, shrink and are freed by `tidy`, a static torch slot is handed out and moved. Two services
over one loaded backend would run those changes from two threads at once, and llama.cpp crashed
the process that way (a pool freed under another thread's pass). So a service claims its
backend when it loads it, and a second service in the same process is refused with an error
saying what to do instead, before it takes a session. Wrappers (the emulated device) are
claimed through to the backend they wrap: that is where the caches are.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

# backend -> (its service, the process it runs in): a forked child inherits this table but not the
# parent's threads, so an owner in another process owns nothing here
_owners: "weakref.WeakKeyDictionary[Any, tuple[str, int]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class BackendInUse(RuntimeError):
    """The backend is already served by another service in this process."""


def _innermost(backend: Any) -> Any:
    """The backend that holds the caches: wrappers keep the one they wrap as `inner`."""
    while getattr(backend, "inner", None) is not None:
        backend = backend.inner
    return backend


def claim(backend: Any, owner: str) -> None:
    """Make `owner` (a service) the only one serving `backend`; BackendInUse if another does."""
    held = _innermost(backend)
    with _lock:
        current, pid = _owners.get(held, (None, None))
        if current is not None and current != owner and pid == os.getpid():
            raise BackendInUse(
                f"this target ({getattr(held, 'name', type(held).__name__)}) is already served by another "
                f"service in this process ({current}), whose device thread owns its caches: load the model "
                "again for a second service, or stop the first one")
        _owners[held] = (owner, os.getpid())


def release(backend: Any, owner: str) -> None:
    """Let `backend` be served again once `owner` has stopped (its device thread has ended)."""
    held = _innermost(backend)
    with _lock:
        if _owners.get(held) == (owner, os.getpid()):
            del _owners[held]
