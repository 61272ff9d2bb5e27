"""The torch backends on a CUDA GPU: graphs captured for real, bfloat16, and greedy parity through the service.

Skipped where torch sees no CUDA device, as on this suite's CI machines: there
test_torch_static.py runs the same static path in float32 with the capture replaced by a
plain call, and test_tree_attention.py its trees. On a GPU machine:

    python -m pytest tests/remote_verify/test_cuda_static.py -n 0

The tiny target's logits are peaked (models/tiny.py), so a greedy choice should not hang on
bfloat16 rounding: where these tests compare paths they compare tokens, and logits only
within bfloat16's reach.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from remote_verify.backends.target import Pass
from remote_verify.backends.torch_backend import TorchTarget
from remote_verify.backends.torch_static import BLOCK_BUCKETS, TorchStaticTarget
from tests.local_draft.test_fallback import target_alone
from tests.remote_verify.test_torch_static import (MAX_TOKENS, assert_service_parity, greedy_rounds,
                                                   random_tokens)
from tests.remote_verify.test_tree_attention import HISTORY, KEPT, PARENTS, TOKENS, chain_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: torch sees none here (test_torch_static.py covers the "
                                       "static path on the CPU)")

# bfloat16 keeps 8 bits of mantissa: a logit near 20 is rounded by up to 0.06, and a pass's sums
# of a few hundred such products move further between kernels of other shapes.
BF16_LOGIT_TOLERANCE = 0.5


@pytest.fixture(scope="module")
def cuda_eager(tiny):
    return TorchTarget(tiny.target, device="cuda")  # bfloat16: the GPU's default


@pytest.fixture(scope="module")
def cuda_static(tiny):
    return TorchStaticTarget(tiny.target, device="cuda", slots=9, context=1024)  # CUDA graphs on


def test_the_target_alone_picks_the_same_tokens_on_every_gpu_path(cuda_eager, cuda_static):
    """Greedy continuations one token at a time: the graphed static path and Hugging Face eager, both
    bfloat16 on the GPU, pick the same tokens."""
    assert cuda_eager.model.dtype == cuda_static.engine.model.dtype == torch.bfloat16
    assert cuda_static.engine.graphs is not None
    rng = np.random.default_rng(1)
    for length in (1, 7, 30, 200):
        context = random_tokens(rng, cuda_static.vocab_size, length)
        assert target_alone(cuda_static, context, MAX_TOKENS) == target_alone(cuda_eager, context, MAX_TOKENS), length
    assert cuda_static.engine.graphs.captured, "no pass ran through a CUDA graph"


def test_float32_on_the_gpu_picks_the_tokens_float32_picks_on_the_cpu(tiny, torch_target):
    """The GPU's kernels compute the CPU's function: in float32 both pick the same tokens. (In bfloat16
    they need not: seen on an H200, the tiny target's bfloat16 continuation of a 7-token prompt left
    float32's at its 35th token. The promise is the target alone as served, dtype included.)"""
    eager = TorchTarget(tiny.target, device="cuda", dtype=torch.float32)
    static = TorchStaticTarget(tiny.target, device="cuda", dtype=torch.float32, slots=2, context=1024)
    rng = np.random.default_rng(1)
    for length in (1, 7, 30, 200):
        context = random_tokens(rng, eager.vocab_size, length)
        reference = target_alone(torch_target, context, MAX_TOKENS)
        assert target_alone(eager, context, MAX_TOKENS) == reference, length
        assert target_alone(static, context, MAX_TOKENS) == reference, length


def test_eight_sessions_in_one_graphed_forward_get_the_verdicts_each_gets_alone(cuda_eager, cuda_static):
    """Greedy verification of drafts that follow the target with random misses, 12 rounds: 8 sessions
    of other lengths batched in each forward (graph replays padded to buckets) get the verdicts the
    first gets alone, and the logits agree within bfloat16's reach."""
    rng = np.random.default_rng(3)
    prompts = [random_tokens(rng, cuda_static.vocab_size, int(n)) for n in (30, 5, 120, 1, 64, 17, 250, 9)]
    caches = [cuda_static.new_cache() for _ in prompts]
    together, together_logits = greedy_rounds(cuda_static, cuda_eager, caches, prompts, 11, 12, batched=True)
    for cache in caches:
        cuda_static.release(cache)
    alone_cache = cuda_eager.new_cache()
    alone, alone_logits = greedy_rounds(cuda_eager, cuda_eager, [alone_cache], prompts[:1], 11, 12, batched=False)
    assert len({accepted for accepted, _ in alone[0]}) > 1, "acceptance never varied: the test could not tell"
    assert together[0] == alone[0]
    worst = max(float(np.abs(a - b).max()) for a, b in zip(alone_logits[0], together_logits[0]))
    assert worst < BF16_LOGIT_TOLERANCE, worst
    shapes = set(cuda_static.engine.graphs.captured)
    assert any(rows > 1 for rows, _, _ in shapes) and all(width in BLOCK_BUCKETS for _, width, _ in shapes)


def test_a_graph_replay_gives_the_numbers_of_the_same_forward_run_eagerly(tiny, cuda_static):
    """Blocks of 1 to 17 after a prompt, through the captured graph and through the same static
    forward without graphs: the same argmax everywhere, logits within bfloat16's reach, and a
    replay of one shape twice gives the same bits."""
    plain = TorchStaticTarget(tiny.target, device="cuda", slots=2, context=1024, cuda_graphs=False)
    rng = np.random.default_rng(5)
    prompt = random_tokens(rng, plain.vocab_size, 40)
    for block in (1, 2, 3, 5, 9, 17):
        tokens = random_tokens(rng, plain.vocab_size, block)
        rows = []
        for target in (cuda_static, plain, cuda_static):
            cache = target.new_cache()
            target.forward(cache, prompt, 1)
            rows.append(target.forward(cache, tokens, block))
            target.release(cache)
        graphed, eager, again = rows
        assert np.array_equal(graphed.argmax(-1), eager.argmax(-1)), block
        assert np.abs(graphed - eager).max() < BF16_LOGIT_TOLERANCE, block
        assert np.array_equal(graphed, again), block


@pytest.mark.parametrize("kind", ["cuda_eager", "cuda_static"])
def test_a_tree_pass_on_the_gpu_scores_each_node_as_its_own_chain(request, kind):
    """Tree attention on the GPU (a mask, so the static path runs it without a graph): every node
    picks what the chain of its ancestors picks alone, and the kept path is what stays."""
    target = request.getfixturevalue(kind)
    cache = target.new_cache()
    target.forward(cache, HISTORY[:-1], 1)
    rows = target.forward(cache, HISTORY[-1:] + TOKENS, len(TOKENS) + 1, tree=PARENTS)
    for node in [-1] + list(range(len(TOKENS))):
        alone = target.forward(target.new_cache(), HISTORY + chain_of(node), 1)[-1]
        assert rows[node + 1].argmax() == alone.argmax(), node
        assert np.abs(rows[node + 1] - alone).max() < BF16_LOGIT_TOLERANCE, node
    target.keep_path(cache, len(HISTORY), KEPT)
    target.truncate(cache, len(HISTORY) + len(KEPT))
    after = target.forward(cache, [7], 1)[-1]
    alone = target.forward(target.new_cache(), HISTORY + chain_of(KEPT[-1]) + [7], 1)[-1]
    assert after.argmax() == alone.argmax() and np.abs(after - alone).max() < BF16_LOGIT_TOLERANCE


def test_batched_argmax_only_passes_send_the_ids_of_their_full_rows(cuda_static):
    """On the GPU only the argmax ids of an argmax-only pass cross to the host: they are the
    argmax of the rows the same pass returns in full."""
    rng = np.random.default_rng(9)
    caches = [cuda_static.new_cache() for _ in range(4)]
    blocks = [random_tokens(rng, cuda_static.vocab_size, n) for n in (1, 3, 5, 9)]
    full = cuda_static.forward_many([Pass(c, b, len(b)) for c, b in zip(caches, blocks)])
    for cache in caches:
        cuda_static.truncate(cache, 0)
    ids = cuda_static.forward_many([Pass(c, b, len(b), argmax_only=True) for c, b in zip(caches, blocks)])
    for cache in caches:
        cuda_static.release(cache)
    assert all(np.array_equal(i, f.argmax(-1)) for i, f in zip(ids, full))


@pytest.mark.parametrize("drafter", ["close_draft", "far_draft"])
def test_greedy_speculation_through_the_service_on_the_gpu_is_token_identical_to_the_target_alone(
        request, tiny, cuda_eager, drafter):
    """A real service on port 0 serving the graphed static path on the GPU: k = 1, 4, 8 and adaptive,
    both drafters (llama.cpp), one session for all prompts: the tokens of the target alone on the GPU."""
    assert_service_parity(request.getfixturevalue(drafter), drafter == "close_draft",
                          TorchStaticTarget(tiny.target, device="cuda", slots=4, context=1024), cuda_eager)
