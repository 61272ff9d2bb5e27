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
    exact = LlamaCppTarget(path, gpu_layers=0, max_context=512)
    prompt = list(range(1000, 1040))
    continuation = [int(t) for t in np.random.default_rng(0).integers(100, 30000, 16)]
    single = one_at_a_time(exact, prompt, continuation)
    assert differing_rows(single, in_blocks(exact, prompt, continuation, 9)) == []
    fast = LlamaCppTarget(path, gpu_layers=0, max_context=512, batch_invariant=False)
    fast_single = one_at_a_time(fast, prompt, continuation)
    assert differing_rows(fast_single, in_blocks(fast, prompt, continuation, 9)), (
        "repacked weights gave the same bits: this check would not see a batch-shaped kernel")
