"""The llama.cpp backend on the CPU refuses a KV pool the machine has no memory for, before allocating it.

On Linux an allocation past the machine's memory succeeds, and the kernel's OOM killer ends the
service later with every session in it (sixteen default-pair clients at once grew a service to
23 GB that way). Here the machine's free memory is emulated, by replacing the reading of
/proc/meminfo with a budget less what the pools hold: really running out would take this
machine's memory. Everything else is the real tiny target in llama.cpp.
"""

from __future__ import annotations

import numpy as np
import pytest

from remote_verify import memory
from remote_verify.backends.llamacpp_backend import LlamaCppTarget
from remote_verify.backends.target import CacheFull
from tests.conftest import TINY_THREADS


@pytest.fixture
def target_with_room_for(tiny, monkeypatch):
    """A fresh tiny target on a machine whose free memory holds `slots` sessions' KV (and a half)
    beside the service's headroom, less what its pools hold."""
    target = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS)
    each = target.kv_bytes_per_session()

    def with_room_for(slots: float) -> LlamaCppTarget:
        budget = memory.ALLOCATION_HEADROOM + int(slots * each)
        monkeypatch.setattr(memory, "available_memory_bytes",
                            lambda: budget - sum(pool.slots for pool in target._pools) * each)
        return target

    return with_room_for


def test_a_pool_the_machine_has_no_room_for_is_refused_and_open_sessions_go_on(target_with_room_for):
    """Room for 3.5 sessions: two share a pool of 2; a third cannot double it (4 more), so it gets a pool
    of its own; a fourth finds no room for any pool and is refused with the sizes, the three go on
    decoding as before, and the slot one of them frees is taken by the next newcomer."""
    target = target_with_room_for(3.5)
    caches = [target.new_cache() for _ in range(3)]
    assert [pool.slots for pool in target._pools] == [2, 1]
    before = [target.forward(cache, [1, 2, 3], 1) for cache in caches]
    with pytest.raises(CacheFull, match=r"KV memory is full: a KV pool of 1 sessions needs .* GiB"):
        target.new_cache()
    assert [pool.slots for pool in target._pools] == [2, 1]
    for cache, logits in zip(caches, before):
        target.truncate(cache, 0)
        np.testing.assert_array_equal(target.forward(cache, [1, 2, 3], 1), logits)
    target.release(caches.pop())
    caches.append(target.new_cache())
    assert [pool.slots for pool in target._pools] == [2, 1] and caches[-1].pool is target._pools[1]


def test_with_room_the_pools_grow_as_before(target_with_room_for):
    """Room for plenty: the check changes nothing, five sessions grow one pool to 8 (the planted check
    against this test: a check that refused too early would leave several small pools)."""
    target = target_with_room_for(100)
    caches = [target.new_cache() for _ in range(5)]
    assert [pool.slots for pool in target._pools] == [8]
    for cache in caches:
        target.release(cache)
