"""A verified block scores with the bits of its tokens decoded one at a time.

Greedy speculation is token-identical to the target alone only if verifying a block does not
move a logit: a near-tie decided one way by a block of k + 1 tokens and the other way by
single-token decoding changes the output. The llama.cpp backend is batch-invariant by
default (`remote_verify/backends/llamacpp_backend.py` lists the kernels that are not, and
what turns each off); the torch backend is when asked. Every check compares whole logit
rows bit for bit: a kernel that sums in another order for another batch shape moves at
least one of 151,936 (or the tiny model's) logits by an ulp.

The tiny float32 model catches llamafile's tinyBLAS (its attention and projections are float
products of 2+ rows: ~5e-6 apart with it). Repacked Q4_K weights and the tiled K-quant product
exist only for quantized weights, so the default pair's target, Q4_K_M, is checked too, in
blocks of 9 (the tiled product starts at 8 rows), beside a fast-kernel control that must
differ: the proof that the comparison sees a batch-shaped kernel when one is there.
"""

from __future__ import annotations

import numpy as np
import pytest

from remote_verify.backends.llamacpp_backend import LlamaCppTarget, has_llamafile_kernels
from remote_verify.backends.target import Pass
from tests.conftest import worker_threads


def one_at_a_time(backend, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """Logits after the prompt and after each continuation token, one forward pass per token."""
    cache = backend.new_cache()
    rows = [backend.forward(cache, prompt, 1)[0]]
    rows += [backend.forward(cache, [token], 1)[0] for token in continuation[:-1]]
    return np.stack(rows)


def in_blocks(backend, prompt: list[int], continuation: list[int], block: int) -> np.ndarray:
    """The same rows, verified as a session does: the prompt with the first block, then blocks of
    `block` tokens, each ending in rows that are "rejected" and rolled back, the next block
    starting again from the rolled-back point."""
    cache, tokens, rows, held = backend.new_cache(), prompt + continuation[:-1], [], 0
    first_row = len(prompt) - 1  # the row whose logits score continuation[0]
    while len(rows) < len(continuation):
        start = first_row + len(rows)
        end = min(start + block, len(tokens))
        logits = backend.forward(cache, tokens[held:end], end - start)
        keep = min(end - start, max(1, block - 2))
        rows.extend(logits[:keep])
        held = start + keep
        backend.truncate(cache, held)
    return np.stack(rows)


def differing_rows(a: np.ndarray, b: np.ndarray) -> list[int]:
    return [i for i in range(len(a)) if not np.array_equal(a[i], b[i])]


def test_the_installed_llama_cpp_has_no_llamafile_kernels():
    """packaging/install.sh builds llama.cpp with -DGGML_LLAMAFILE=OFF (and rebuilds one that has them)."""
    assert not has_llamafile_kernels(), "llama.cpp was built with llamafile: run `bash packaging/install.sh`"


@pytest.mark.parametrize("block", [2, 5, 9])
def test_llamacpp_block_scores_like_one_token_at_a_time(llamacpp_target, tiny, block):
    prompt, continuation = list(range(5, 45)), [(7 * i + 3) % 200 + 1 for i in range(20)]
    single = one_at_a_time(llamacpp_target, prompt, continuation)
    blocked = in_blocks(llamacpp_target, prompt, continuation, block)
    assert differing_rows(single, blocked) == [], (
        f"largest gap {np.abs(single - blocked).max():.3g} logits")
    assert llamacpp_target.batch_invariant


def test_torch_batch_invariant_mode_scores_like_one_token_at_a_time(tiny):
    from remote_verify.backends.torch_backend import TorchTarget

    target = TorchTarget(tiny.target, device="cpu", batch_invariant=True)
    prompt, continuation = list(range(5, 45)), [(7 * i + 3) % 200 + 1 for i in range(20)]
    single = one_at_a_time(target, prompt, continuation)
    assert differing_rows(single, in_blocks(target, prompt, continuation, 5)) == []


@pytest.mark.slow
def test_the_default_target_verifies_blocks_of_nine_bit_for_bit():
    """Qwen2.5-Coder-1.5B Q4_K_M: batch-invariant rows match exactly; the fast kernels do not."""
    from models.fetch import fetch_chunks
    from models.registry import QWEN_CODER, file_path

    path = file_path(QWEN_CODER, QWEN_CODER.target)
    fetch_chunks(QWEN_CODER.target.chunks, path)
    exact = LlamaCppTarget(path, gpu_layers=0, max_context=512, n_threads=worker_threads())
    prompt = list(range(1000, 1040))
    continuation = [int(t) for t in np.random.default_rng(0).integers(100, 30000, 16)]
    single = one_at_a_time(exact, prompt, continuation)
    assert differing_rows(single, in_blocks(exact, prompt, continuation, 9)) == []
    fast = LlamaCppTarget(path, gpu_layers=0, max_context=512, batch_invariant=False, n_threads=worker_threads())
    fast_single = one_at_a_time(fast, prompt, continuation)
    assert differing_rows(fast_single, in_blocks(fast, prompt, continuation, 9)), (
        "repacked weights gave the same bits: this check would not see a batch-shaped kernel")



def thread_split_rows(path, first_id: int, **options) -> tuple[np.ndarray, np.ndarray]:
    """(one token at a time on 1 thread, blocks of 5 on 1 thread for steps and 2 for blocks): the
    split a service started beside a drafter runs with (wire/threads.py)."""
    prompt = list(range(first_id, first_id + 40))
    continuation = [first_id + (7 * i + 3) % 200 for i in range(16)]
    alone = LlamaCppTarget(path, gpu_layers=0, n_threads=1, slots=1, **options)
    split = LlamaCppTarget(path, gpu_layers=0, n_threads=1, n_threads_batch=2, slots=1, **options)
    return one_at_a_time(alone, prompt, continuation), in_blocks(split, prompt, continuation, 5)


def test_more_threads_for_blocks_move_no_logit(tiny):
    """A block run on 2 threads scores like its tokens decoded one at a time on 1: a thread count
    splits the work of a matrix product, never a sum."""
    single, blocked = thread_split_rows(tiny.target_gguf, 5, max_context=256)
    assert differing_rows(single, blocked) == []


@pytest.mark.slow
def test_the_default_target_scores_the_same_with_more_threads_for_blocks():
    """Qwen2.5-Coder-1.5B Q4_K_M (quantized kernels): the colocated split, steps on 1 thread and
    blocks on 2, gives the bits of one thread throughout."""
    from models.fetch import fetch_chunks
    from models.registry import QWEN_CODER, file_path

    path = file_path(QWEN_CODER, QWEN_CODER.target)
    fetch_chunks(QWEN_CODER.target.chunks, path)
    single, blocked = thread_split_rows(path, 1000, max_context=512)
    assert differing_rows(single, blocked) == []

# ---- several sessions in one pass (remote_verify/backends/llamacpp_backend.py, forward_many) ----

NEIGHBOUR_HISTORIES = [3, 31, 33, 64, 100, 257, 300]  # cached lengths around the SIMD and padding steps


def scripted_session(backend, cache, neighbours=None, seed=0, between_rounds=None) -> list[np.ndarray]:
    """A session's rounds, each verifying a block of 5 and keeping 1 to 5 positions, with
    `neighbours` (other sessions' caches, already filled) decoding blocks of 1 to 9 tokens and
    rolling back in the same passes; `between_rounds(round)` runs after each. Returns this
    session's logits, round after round."""
    rng, others = np.random.default_rng(seed), np.random.default_rng(seed + 1)  # the session's draws and theirs
    prompt = [int(t) for t in rng.integers(1, 250, 40)]
    rows = []
    feed = prompt + [int(t) for t in rng.integers(1, 250, 4)]
    for _ in range(8):
        passes = [Pass(cache, feed, 5)]
        for other in neighbours or []:
            passes.append(Pass(other, [int(t) for t in others.integers(1, 250, int(others.integers(1, 10)))], 1))
        order = others.permutation(len(passes))  # the pass lists sessions in any order
        results = backend.forward_many([passes[i] for i in order])
        logits = results[int(np.argmax(order == 0))]  # (5, V)
        rows.append(logits)
        keep = int(rng.integers(1, 6))
        backend.truncate(cache, cache.length - 5 + keep - 1)  # the last kept row's token is the next feed
        for other in neighbours or []:
            backend.truncate(other, other.length - int(others.integers(0, 3)))
        feed = [int(t) for t in rng.integers(1, 250, 5)]
        if between_rounds is not None:
            between_rounds(len(rows))
    return rows


def beside_seven_others(pooled) -> list[np.ndarray]:
    """scripted_session in the fourth slot of a pool whose seven other sessions hold histories of
    NEIGHBOUR_HISTORIES tokens and decode beside it."""
    caches = [pooled.new_cache() for _ in range(8)]
    mine, neighbours = caches[3], caches[:3] + caches[4:]
    rng = np.random.default_rng(1)
    pooled.forward_many([Pass(other, [int(t) for t in rng.integers(1, 250, n)], 1)
                         for other, n in zip(neighbours, NEIGHBOUR_HISTORIES)])
    return scripted_session(pooled, mine, neighbours)


class UnifiedKvTarget(LlamaCppTarget):
    """The control: one KV cache shared by the pool's sequences (llama.cpp's default), where a
    session's cells sit between its neighbours'. Not used by the service."""

    def context_params(self, slots):
        params = super().context_params(slots)
        params.kv_unified, params.n_ctx = True, self.max_context
        return params


def test_a_session_scores_the_same_alone_and_beside_seven_others(tiny):
    """The same session's rounds give bit-identical logits alone in a context of a single
    sequence and beside seven sessions of other lengths decoding blocks of other sizes in the
    same passes (a KV stream per sequence): the batch composition moves no logit. The control,
    a unified KV cache, must differ: the proof that the comparison sees a sum over cache cells
    taken in another order."""
    single = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=1)
    alone = scripted_session(single, single.new_cache())
    pooled = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=8, grow=False)
    beside = beside_seven_others(pooled)
    for round_, (a, b) in enumerate(zip(alone, beside)):
        assert differing_rows(a, b) == [], f"round {round_}: largest gap {np.abs(a - b).max():.3g}"
    assert pooled.batch_invariant
    unified = beside_seven_others(UnifiedKvTarget(tiny.target_gguf, gpu_layers=0, n_threads=1, slots=8, grow=False))
    assert any(differing_rows(a, b) for a, b in zip(alone, unified)), "a unified cache gave the same bits"


def test_argmax_only_gives_the_argmax_of_the_logits(llamacpp_target):
    """A greedy pass's ids are the argmax of the logits the same pass would return."""
    caches = [llamacpp_target.new_cache() for _ in range(2)]
    try:
        logits = llamacpp_target.forward_many([Pass(caches[0], list(range(5, 25)), 4), Pass(caches[1], [7, 8], 2)])
        ids = llamacpp_target.forward_many([Pass(caches[0], [30, 31], 2, argmax_only=True)])
        for cache in caches:
            llamacpp_target.truncate(cache, 0)
        again = llamacpp_target.forward_many([Pass(caches[0], list(range(5, 25)), 4, argmax_only=True),
                                              Pass(caches[1], [7, 8], 2, argmax_only=True)])
        assert again[0].tolist() == logits[0].argmax(axis=-1).tolist()
        assert again[1].tolist() == logits[1].argmax(axis=-1).tolist()
        assert ids[0].shape == (2,) and ids[0].dtype.kind == "i"
    finally:
        for cache in caches:
            llamacpp_target.release(cache)


@pytest.mark.slow
def test_the_default_target_scores_a_session_the_same_beside_seven_others():
    """Qwen2.5-Coder-1.5B Q4_K_M (quantized weights, passes of 8+ rows): a session's rounds give
    the same bits alone and beside seven others decoding in the same passes."""
    from models.fetch import fetch_chunks
    from models.registry import QWEN_CODER, file_path

    path = file_path(QWEN_CODER, QWEN_CODER.target)
    fetch_chunks(QWEN_CODER.target.chunks, path)
    single = LlamaCppTarget(path, gpu_layers=0, max_context=512, slots=1, n_threads=worker_threads())
    alone = scripted_session(single, single.new_cache())
    beside = beside_seven_others(LlamaCppTarget(path, gpu_layers=0, max_context=512, slots=8, grow=False,
                                                 n_threads=worker_threads()))
    for round_, (a, b) in enumerate(zip(alone, beside)):
        assert differing_rows(a, b) == [], f"round {round_}: largest gap {np.abs(a - b).max():.3g}"
