"""Shared passes as one micro-batch, and sessions moved between KV pools, move no logit.

`remote_verify/backends/llama_pass_plan.py` pads blocks and fills idle streams so that a pass
runs as one llama.cpp micro-batch; `llamacpp_backend.py` moves every session of a pool into a
bigger (or smaller) one. Both are checked bit for bit against the session alone in a context
of its own, with the tiny model's real llama.cpp; the plan's arithmetic is checked by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from remote_verify.backends.llama_pass_plan import DecodeCosts, plan_lengths, ubatch_count
from remote_verify.backends.llamacpp_backend import LlamaCppTarget, restream
from remote_verify.backends.target import Pass
from tests.remote_verify.test_batch_invariance import NEIGHBOUR_HISTORIES, differing_rows, scripted_session


# ---- the plan (pure arithmetic) ----

def test_ubatch_count_follows_llama_cpps_split_of_consecutive_equal_blocks():
    """Consecutive ids with equal blocks: one micro-batch; a gap or a shorter block: more."""
    assert ubatch_count({0: 5, 1: 5, 2: 5}, 512) == 1
    assert ubatch_count({0: 5, 2: 5, 4: 5}, 512) == 3  # no two ids consecutive
    assert ubatch_count({0: 5, 1: 3}, 512) == 2  # 3 tokens of both, then 2 of the first
    assert ubatch_count({0: 5, 1: 3, 3: 5, 4: 5}, 512) == 3  # {0, 1} x 3, {0} x 2, {3, 4} x 5
    assert ubatch_count({0: 300, 1: 300}, 512) == 2  # 256 of each fit a micro-batch of 512


def test_the_plan_pads_only_where_the_micro_batches_it_saves_cost_more_than_its_tokens():
    """Cheap micro-batches: blocks as sent. Dear ones: one micro-batch, the gap filled. A
    stream without room is never filled."""
    real, room = {0: 5, 2: 3}, {seq: 100 for seq in range(4)}
    as_sent = plan_lengths(real, room, per_ubatch=0.001, per_token=1.0, n_ubatch=512)
    assert as_sent.lengths == real and as_sent.ubatches == 2
    one = plan_lengths(real, room, per_ubatch=1.0, per_token=0.01, n_ubatch=512)
    assert one.lengths == {0: 5, 1: 5, 2: 5} and one.ubatches == 1 and one.padding(real) == 7
    no_room = plan_lengths(real, {**room, 1: 4}, per_ubatch=1.0, per_token=0.01, n_ubatch=512)
    assert no_room.lengths == real  # padding alone would not join the two: no micro-batch saved


def test_decode_costs_recover_the_prices_of_a_micro_batch_and_a_token():
    """Decodes timed as 2 ms a micro-batch and 0.05 ms a token give back those prices."""
    costs = DecodeCosts()
    rng = np.random.default_rng(0)
    for _ in range(400):
        ubatches, tokens = int(rng.integers(1, 8)), int(rng.integers(2, 60))
        costs.observe(ubatches, tokens, 0.002 * ubatches + 0.00005 * tokens)
    per_ubatch, per_token = costs.prices
    assert per_ubatch == pytest.approx(0.002, rel=0.02) and per_token == pytest.approx(0.00005, rel=0.02)


def test_restream_moves_a_sequences_state_to_a_context_of_other_streams():
    """The cells stay as saved; the stream count and the empty streams around them change."""
    word = lambda value: int(value).to_bytes(4, "little")  # noqa: E731
    cells = word(3) + b"cells of stream 1"
    saved = word(0xAF143CD8) + word(1) + word(4) + word(0) + cells + word(0) + word(0)
    assert restream(saved, 1, 2) == word(0xAF143CD8) + word(1) + word(2) + cells + word(0)
    with pytest.raises(ValueError, match="outside its own stream"):
        restream(word(0xAF143CD8) + word(1) + word(2) + word(1) + cells, 1, 2)


# ---- the same bits in llama.cpp ----

def filled_pool(backend, count: int, rng) -> tuple[list, list[list[int]]]:
    """`count` sessions holding histories of NEIGHBOUR_HISTORIES' lengths (and the tokens)."""
    caches, histories = [backend.new_cache() for _ in range(count)], []
    for cache, length in zip(caches, NEIGHBOUR_HISTORIES * 2):
        histories.append([int(t) for t in rng.integers(1, 250, length)])
        backend.forward_many([Pass(cache, histories[-1], 1)])
    return caches, histories


def test_padded_and_filled_passes_move_no_logit(tiny):
    """A session's rounds give the bits it gets alone when its passes are padded into one
    micro-batch (the neighbours' blocks of 1 to 9 tokens padded to the longest, the idle streams
    between them, one a free slot, filled and emptied again), and an idle session's next token,
    and a new session's first, score as if no fill had touched their streams."""
    single = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=1)
    alone = scripted_session(single, single.new_cache())
    pooled = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=8, grow=False, padding="always")
    caches, histories = filled_pool(pooled, 8, np.random.default_rng(1))
    mine = caches[3]
    pooled.truncate(mine, 0)
    pooled.release(caches[2])  # a free slot between members: filled too, and must stay empty
    ubatches_before = pooled.ubatches
    beside = scripted_session(pooled, mine, neighbours=[caches[0], caches[6]])
    assert pooled.padded_tokens > 0 and pooled.ubatches - ubatches_before == 8, "the passes were not padded"
    for round_, (a, b) in enumerate(zip(alone, beside)):
        assert differing_rows(a, b) == [], f"round {round_}: largest gap {np.abs(a - b).max():.3g}"
    for idle in (1, 4, 5):  # filled in every round: the streams between slots 0, 3 and 6
        reference = single.new_cache()
        expected = single.forward(reference, histories[idle] + [7], 1)
        single.release(reference)
        assert caches[idle].length == len(histories[idle])
        assert differing_rows(pooled.forward(caches[idle], [7], 1), expected) == [], f"slot {idle} was moved"
    newcomer = pooled.new_cache()  # the free slot 2, filled and emptied in every round
    reference = single.new_cache()
    assert newcomer.seq == 2
    assert differing_rows(pooled.forward(newcomer, histories[2], 1), single.forward(reference, histories[2], 1)) == []


def test_sessions_moved_into_bigger_and_smaller_pools_keep_their_bits(tiny):
    """A pool of 1 doubles as sessions arrive (each move copying every session's cells), and
    shrinks to fit when most leave (once it has been that empty for POOL_KEEP_S: tidy); a session
    whose rounds run through those moves scores exactly as alone, and the pools are freed when
    the last session closes."""
    import time

    from remote_verify.backends.llamacpp_backend import POOL_KEEP_S

    single = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=1)
    alone = scripted_session(single, single.new_cache())
    pooled = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, max_context=512, slots=8)
    mine = pooled.new_cache()
    arrivals, sizes, rng = [], [], np.random.default_rng(2)

    def between_rounds(round_: int) -> None:
        if round_ <= 4:  # two sessions arrive after each of the first four rounds: 1 -> 4 -> 8 -> 8 -> 8 + 1
            for _ in range(2):
                arrivals.append(pooled.new_cache())
                pooled.forward(arrivals[-1], [int(t) for t in rng.integers(1, 250, 30)], 1)
        elif round_ == 5:  # all but one leave: the pool of 8 is kept a while, then shrinks
            for cache in arrivals[:-1]:
                pooled.release(cache)
            sizes.append([pool.slots for pool in pooled._pools])
            pooled.tidy(time.monotonic() + POOL_KEEP_S / 2)  # not quiet long enough
            sizes.append([pool.slots for pool in pooled._pools])
            pooled.tidy(time.monotonic() + POOL_KEEP_S)  # into a pool just big enough: this session alone
        sizes.append([pool.slots for pool in pooled._pools])

    moved = scripted_session(pooled, mine, between_rounds=between_rounds)
    assert sizes[:7] == [[4], [8], [8], [8, 1], [8, 1], [8, 1], [1, 1]], sizes
    for round_, (a, b) in enumerate(zip(alone, moved)):
        assert differing_rows(a, b) == [], f"round {round_}: largest gap {np.abs(a - b).max():.3g}"
    pooled.release(arrivals[-1])
    pooled.release(mine)
    assert pooled._pools == []


def test_a_failed_padded_pass_leaves_the_filled_streams_as_they_were(tiny):
    """A decode that fails after idle streams were filled (here: raised after llama.cpp ran it)
    still empties them: the idle session's next token scores as before."""
    single = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=1)
    pooled = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=8, grow=False, padding="always")
    caches, histories = filled_pool(pooled, 8, np.random.default_rng(3))
    context = caches[0].pool.context
    real_decode = context.decode

    def decode_then_fail(batch):
        real_decode(batch)
        raise RuntimeError("llama_decode failed")

    context.decode = decode_then_fail
    with pytest.raises(RuntimeError):
        pooled.forward_many([Pass(caches[0], [5, 6, 7], 1), Pass(caches[6], [8], 1)])
    context.decode = real_decode
    assert pooled.padded_tokens > 0
    expected = single.forward(single.new_cache(), histories[3] + [7], 1)
    assert differing_rows(pooled.forward(caches[3], [7], 1), expected) == []


def test_a_cpu_pool_holds_as_many_sessions_as_its_memory_bound_allows(tiny, monkeypatch):
    """On the CPU the largest pool holds the service's sessions, or as many as CPU_POOL_BYTES of
    KV memory hold if fewer (allocating a pool holds every session); an explicit size wins."""
    from remote_verify.backends import llamacpp_backend

    assert LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, max_context=256, sessions=5).slots == 5
    per_session = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, max_context=256).kv_bytes_per_session()
    assert per_session == 256 * 2 * 2 * 2 * 16 * 4  # positions x layers x (keys, values) x KV heads x head size x 4 bytes
    monkeypatch.setattr(llamacpp_backend, "CPU_POOL_BYTES", 3 * per_session + 1)
    assert LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, max_context=256, sessions=32).slots == 3
    assert LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, max_context=256, slots=8).slots == 8


def test_sessions_churning_around_the_grow_and_shrink_points_allocate_no_pool_after_the_first(tiny):
    """One session stays; seven more open and close, five times over. The pool grows 1 -> 2 -> 4 -> 8
    once and is kept (it used to shrink at every close and grow again at every open: three pool
    allocations and moves a cycle, 3.3 GB each for the default 1.5B); tidy() shrinks it once the
    churn has stopped for POOL_KEEP_S, and the last close frees everything."""
    import time

    from remote_verify.backends.llamacpp_backend import POOL_KEEP_S

    pooled = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, max_context=256, slots=8)
    made = []
    new_context = pooled._new_context
    pooled._new_context = lambda slots: made.append(slots) or new_context(slots)
    stays = pooled.new_cache()
    for _ in range(5):
        churn = [pooled.new_cache() for _ in range(7)]
        for cache in churn:
            pooled.forward(cache, [5, 6, 7], 1)
        for cache in churn:
            pooled.release(cache)
        pooled.tidy()  # the service's periodic call: nothing has been quiet long enough
    assert made == [1, 2, 4, 8] and [pool.slots for pool in pooled._pools] == [8]
    pooled.tidy(time.monotonic() + POOL_KEEP_S)
    assert made == [1, 2, 4, 8, 1] and [pool.slots for pool in pooled._pools] == [1]
    pooled.release(stays)
    assert pooled._pools == []
