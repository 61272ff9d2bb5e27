"""The static-cache torch path on the CPU (float32, eager): exact where HF eager is, batched, slotted.

CUDA graphs and bfloat16 are not exercised here: the graph path's padding and buffers are,
with the capture replaced by a plain call. On a CUDA machine test_cuda_static.py runs the
capture (greedy parity through the service included), and `python -m benchmarks.gpu` compares
its logits with the same forward run eagerly on the real shapes.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from remote_verify.acceptance import accept_greedy
from remote_verify.backends.cuda_graphs import WARMUP_RUNS, GraphedForward
from remote_verify.backends.factory import load_backend
from remote_verify.backends.target import Pass, run_passes
from remote_verify.backends.torch_static import BLOCK_BUCKETS, NoFreeSlot, TorchStaticTarget
from tests.conftest import RunningService, hello_for
from tests.local_draft.test_fallback import target_alone
from wire.protocol import SamplingParams

# float32 on both paths; the logits have std 6 (models/tiny.py). Measured here: under 1e-5,
# from summation order (SDPA over a padded key range, matrix products of other shapes).
LOGIT_TOLERANCE = 1e-4
SLOTS = 9


@pytest.fixture(scope="module")
def static_target(tiny):
    return TorchStaticTarget(tiny.target, device="cpu", slots=SLOTS, context=1024)


def random_tokens(rng, vocab, n):
    return rng.integers(0, vocab, n).tolist()


def test_logits_match_hf_eager_at_every_position(torch_target, static_target):
    """Prompts of 1-200 tokens, then blocks of 1-17 with rollbacks between: every logit row within
    the tolerance of the HF eager path and the same argmax, at every position."""
    rng = np.random.default_rng(7)
    vocab = torch_target.vocab_size
    worst = 0.0
    for prompt_length in (1, 13, 200):
        eager_cache, static_cache = torch_target.new_cache(), static_target.new_cache()
        feed, length = random_tokens(rng, vocab, prompt_length), 0
        for block in (1, 2, 3, 5, 9, 17, 4):
            eager = torch_target.forward(eager_cache, feed, len(feed))
            fast = static_target.forward(static_cache, feed, len(feed))
            assert eager.shape == fast.shape == (len(feed), vocab)
            assert np.array_equal(eager.argmax(-1), fast.argmax(-1))
            worst = max(worst, float(np.abs(eager - fast).max()))
            length += len(feed)
            length -= int(rng.integers(0, len(feed)))  # roll back part of what was just fed
            torch_target.truncate(eager_cache, length)
            static_target.truncate(static_cache, length)
            feed = random_tokens(rng, vocab, block)
        static_target.release(static_cache)
    assert worst < LOGIT_TOLERANCE, worst


def greedy_rounds(target, oracle, caches, prompts, seed, rounds, batched):
    """Greedy verification of drafts that follow the oracle (the HF eager target) with a random
    token now and then, so verdicts vary; each session draws from its own stream. Returns each
    session's verdicts and logits."""
    streams = [np.random.default_rng([seed, s]) for s in range(len(prompts))]
    committed = [list(p) for p in prompts]
    pending = [list(p) for p in prompts]  # fed next round: not in the cache yet
    verdicts, logits_seen = [[] for _ in prompts], [[] for _ in prompts]
    for _ in range(rounds):
        drafts = []
        for rng, history in zip(streams, committed):
            k = int(rng.integers(0, 9))
            truth = target_alone(oracle, history, k) if k else []
            drafts.append([int(rng.integers(0, target.vocab_size)) if rng.random() < 0.15 else token
                           for token in truth])
        passes = [Pass(cache, feed + draft, len(draft) + 1) for cache, feed, draft in zip(caches, pending, drafts)]
        if batched:
            results = run_passes(target, passes)  # one forward: forward_many
        else:
            results = [target.forward(p.cache, p.tokens, p.n_logits) for p in passes]
        for s, logits in enumerate(results):
            accepted, token = accept_greedy(logits.argmax(-1).tolist(), drafts[s])
            verdicts[s].append((accepted, token))
            logits_seen[s].append(logits)
            committed[s] += drafts[s][:accepted] + [token]
            target.truncate(caches[s], len(committed[s]) - 1)  # the new token is fed next round
            pending[s] = [token]
    return verdicts, logits_seen


def test_a_session_alone_and_beside_seven_others_gets_the_same_verdicts(torch_target, static_target):
    """The same session verified alone and in one forward with 7 others of other lengths, 12
    rounds: the same greedy verdicts, logits within the tolerance (not bit-identical on this CPU:
    MKL's sgemm picks its kernel by row count, so a row's sums change order with the batch's size)."""
    rng = np.random.default_rng(3)
    prompts = [random_tokens(rng, static_target.vocab_size, int(n)) for n in (30, 5, 120, 1, 64, 17, 250, 9)]
    alone_cache = static_target.new_cache()
    alone, alone_logits = greedy_rounds(static_target, torch_target, [alone_cache], prompts[:1], 11, 12, batched=False)
    static_target.release(alone_cache)
    caches = [static_target.new_cache() for _ in prompts]
    together, together_logits = greedy_rounds(static_target, torch_target, caches, prompts, 11, 12, batched=True)
    for cache in caches:
        static_target.release(cache)
    assert len({accepted for accepted, _ in alone[0]}) > 1, "acceptance never varied: the test could not tell"
    assert together[0] == alone[0]
    worst = max(float(np.abs(a - b).max()) for a, b in zip(alone_logits[0], together_logits[0]))
    assert worst < LOGIT_TOLERANCE, worst


class ReplayByCalling(GraphedForward):
    """Stand-in for CUDA graph capture, which needs a GPU: a "replay" runs the recorded forward
    again on the same static buffers and copies its result into the static output."""

    def _record(self, forward):
        for _ in range(WARMUP_RUNS):
            forward()
        hidden = forward()
        return (lambda: hidden.copy_(forward())), hidden


def test_the_graph_path_padding_to_buckets_gives_the_verdicts_of_the_eager_path(tiny, torch_target, static_target):
    """The CUDA-graph path's bookkeeping on the CPU (capture replaced by a plain call): passes
    padded to (rows, block, keys) buckets, padding rows in the scratch slot, placeholder warm-ups
    at capture. 8 sessions batched give the verdicts of one session alone on the eager path;
    a shape seen before reuses its capture; blocks longer than 33 run eagerly."""
    graphed = TorchStaticTarget(tiny.target, device="cpu", slots=SLOTS, context=1024)
    engine = graphed.engine
    engine.graphs = ReplayByCalling(engine.model, engine.kv, engine.rope)
    rng = np.random.default_rng(3)
    prompts = [random_tokens(rng, graphed.vocab_size, int(n)) for n in (30, 5, 120, 1, 64, 17, 250, 9)]
    caches = [graphed.new_cache() for _ in prompts]
    together, together_logits = greedy_rounds(graphed, torch_target, caches, prompts, 11, 12, batched=True)
    alone_cache = static_target.new_cache()
    alone, alone_logits = greedy_rounds(static_target, torch_target, [alone_cache], prompts[:1], 11, 12, batched=False)
    static_target.release(alone_cache)
    assert together[0] == alone[0]
    assert max(float(np.abs(a - b).max()) for a, b in zip(alone_logits[0], together_logits[0])) < LOGIT_TOLERANCE
    shapes = set(engine.graphs.captured)
    assert len(shapes) > 2 and all(rows & (rows - 1) == 0 and width in BLOCK_BUCKETS and keys >= 256
                                   for rows, width, keys in shapes)
    assert all(width <= 33 for _, width, _ in shapes)  # the 64-, 120- and 250-token prompts ran eagerly
    assert any(rows > 1 for rows, _, _ in shapes)  # passes of several sessions shared a replay
    # one more round in shapes already captured adds no capture
    lengths = [cache.length for cache in caches]
    first = graphed.forward_many([Pass(cache, [1, 2, 3, 4, 5], 5, argmax_only=True) for cache in caches])
    captured = len(engine.graphs.captured)
    for cache, n in zip(caches, lengths):
        graphed.truncate(cache, n)
    again = graphed.forward_many([Pass(cache, [1, 2, 3, 4, 5], 5, argmax_only=True) for cache in caches])
    assert len(engine.graphs.captured) == captured
    assert all(np.array_equal(a, b) for a, b in zip(first, again))  # the same replay, the same bits
    assert [cache.length for cache in caches] == [n + 5 for n in lengths]


def test_batched_passes_equal_their_own_forwards_and_argmax_only_sends_ids(static_target):
    """One forward_many of a long prompt, blocks of 1-9 and argmax-only passes: each result is what
    forward gives for that pass alone (argmax equal, logits close), argmax_only gives the ids."""
    rng = np.random.default_rng(5)
    vocab = static_target.vocab_size
    prefixes = [random_tokens(rng, vocab, n) for n in (3, 40, 7, 90)]
    feeds = [random_tokens(rng, vocab, n) for n in (300, 1, 5, 9)]
    wanted = [1, 1, 5, 9]
    alone = []
    for prefix, feed, n in zip(prefixes, feeds, wanted):
        cache = static_target.new_cache()
        static_target.forward(cache, prefix, 1)
        alone.append(static_target.forward(cache, feed, n))
        static_target.release(cache)
    caches = [static_target.new_cache() for _ in prefixes]
    static_target.forward_many([Pass(c, p, 1) for c, p in zip(caches, prefixes)])
    argmax_only = [False, True, False, True]
    results = static_target.forward_many([Pass(c, f, n, a) for c, f, n, a in zip(caches, feeds, wanted, argmax_only)])
    for result, reference, ids_only in zip(results, alone, argmax_only):
        if ids_only:
            assert result.shape == (reference.shape[0],) and result.dtype.kind == "i"
            assert np.array_equal(result, reference.argmax(-1))
        else:
            assert result.shape == reference.shape
            assert np.array_equal(result.argmax(-1), reference.argmax(-1))
            assert float(np.abs(result - reference).max()) < LOGIT_TOLERANCE
    assert [c.length for c in caches] == [len(p) + len(f) for p, f in zip(prefixes, feeds)]
    for cache in caches:
        static_target.release(cache)


def test_slots_are_handed_out_refused_when_all_are_taken_and_given_back(static_target):
    """SLOTS sessions get a slot each; one more is refused with a message saying what to do;
    a released cache is refused in a pass; release and a cache dropped without release both give
    their slot back."""
    caches = [static_target.new_cache() for _ in range(SLOTS)]
    assert sorted(c.slot for c in caches) == list(range(SLOTS))
    with pytest.raises(NoFreeSlot, match="--max-sessions"):
        static_target.new_cache()
    released = caches.pop()
    static_target.release(released)
    with pytest.raises(ValueError, match="not released"):
        static_target.forward(released, [1], 1)
    caches.append(static_target.new_cache())
    assert caches[-1].slot == released.slot
    dropped_slot = caches.pop(0).slot
    gc.collect()
    caches.append(static_target.new_cache())
    assert caches[-1].slot == dropped_slot
    for cache in caches:
        static_target.release(cache)
    assert static_target.engine.pool.free == SLOTS


def test_bad_passes_are_refused_with_what_was_wrong(static_target):
    """A pass past the cache's positions, without tokens or with n_logits out of range is refused."""
    cache = static_target.new_cache()
    with pytest.raises(ValueError, match="exceed the static cache"):
        static_target.forward(cache, [1] * (static_target.max_context + 1), 1)
    with pytest.raises(ValueError, match="n_logits"):
        static_target.forward(cache, [1, 2], 3)
    with pytest.raises(ValueError, match="share a cache"):
        static_target.forward_many([Pass(cache, [1], 1), Pass(cache, [2], 1)])
    assert cache.length == 0  # nothing ran
    static_target.release(cache)


def test_load_backend_refuses_static_where_it_does_not_apply(tiny):
    """--torch-static only with the torch backend, and never with --batch-invariant."""
    with pytest.raises(ValueError, match="--backend torch"):
        load_backend("llamacpp", tiny.target_gguf, device="cpu", torch_static=True)
    with pytest.raises(ValueError, match="batch-invariant"):
        load_backend("torch", tiny.target, device="cpu", torch_static=True, batch_invariant=True)


def test_the_static_path_is_the_default_on_a_gpu_only_and_gives_way_to_eager_for_what_it_does_not_implement(
        tiny, tmp_path, caplog):
    """Unasked, the torch backend serves eagerly on the CPU (the static path is chosen on a GPU, which this
    machine lacks: the choice itself is the same code); a model the static path does not implement is served
    eagerly with a warning where the static path was only the default, and refused where it was asked for."""
    import shutil

    from remote_verify.backends.factory import _static_or_eager
    from remote_verify.backends.qwen2_static import NotPlainQwen2
    from remote_verify.backends.torch_backend import TorchTarget

    assert type(load_backend("torch", tiny.target, device="cpu")) is TorchTarget
    assert isinstance(_static_or_eager(tiny.target, "cpu", 2, 256), TorchStaticTarget)
    sliding = tmp_path / "sliding"
    shutil.copytree(tiny.target, sliding)
    config = json.loads((sliding / "config.json").read_text())
    (sliding / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
    with caplog.at_level("WARNING", logger="remote_verify.backends.factory"):
        fallback = _static_or_eager(sliding, "cpu", 2, 256)
    assert type(fallback) is TorchTarget
    assert "plain Qwen2 only (sliding-window attention is on): serving with the eager torch path" in caplog.text
    with pytest.raises(NotPlainQwen2, match="plain Qwen2 only"):
        load_backend("torch", sliding, device="cpu", torch_static=True)


def test_the_gpu_holds_as_many_slots_as_fit_beside_the_headroom():
    """KV slots sized by the free memory: all that are wanted where they fit, fewer where not, none where
    even the headroom does not fit; a slot's bytes are its layers' keys and values."""
    from remote_verify.backends.qwen2_static import Qwen2Shape, StaticKV
    from remote_verify.backends.torch_static import GPU_HEADROOM_BYTES, slots_that_fit

    gib = 1 << 30
    assert slots_that_fit(64, gib, GPU_HEADROOM_BYTES + 100 * gib) == 64
    assert slots_that_fit(64, gib, GPU_HEADROOM_BYTES + 10 * gib + gib // 2) == 10
    assert slots_that_fit(64, gib, GPU_HEADROOM_BYTES - 1) == 0
    shape_32b = Qwen2Shape(layers=64, heads=40, kv_heads=8, head_dim=128, eps=1e-5, rope_theta=1e6)
    import torch

    assert StaticKV.slot_bytes(shape_32b, 4096, torch.bfloat16) == 2 * 64 * 4096 * 8 * 128 * 2  # 1 GiB
    # the 32B's slots of 4,096 positions (and one more for padding) in 65 GiB free: 59 sessions and the scratch
    assert slots_that_fit(65, StaticKV.slot_bytes(shape_32b, 4097, torch.bfloat16), 65 * gib) - 1 == 59


PROMPTS = ["def quicksort(arr):", "The quick brown fox", "class Stack:\n    def push(self, x):",
           "éàü 中文 🎉", "1, 2, 3, 5, 8,", "A"]
MAX_TOKENS = 40


@pytest.mark.parametrize("drafter", ["close_draft", "far_draft"])
def test_greedy_speculation_through_the_service_is_token_identical_to_the_target_alone(
        request, tiny, torch_target, drafter):
    """A real service on port 0 serving the static path: k = 1, 4, 8 and adaptive, both drafters,
    one session for all prompts (Sync between them): the tokens of the HF eager target alone."""
    assert_service_parity(request.getfixturevalue(drafter), drafter == "close_draft",
                          TorchStaticTarget(tiny.target, device="cpu", slots=4, context=1024), torch_target)


def assert_service_parity(draft, close: bool, backend, reference) -> None:
    """Greedy speculation through a service serving `backend`, k = 1, 4, 8 and adaptive, one session
    for all prompts: every reply the tokens of `reference` alone (and, with the close drafter, blocks
    really verified)."""
    service = RunningService(backend)
    try:
        references = {p: target_alone(reference, draft.tokenize(p), MAX_TOKENS) for p in PROMPTS}
        for k in (1, 4, 8, None):
            client = VerifyClient(service.url, hello_for(draft))
            speculator = Speculator(draft, client, SamplingParams(), k=k)
            accepted = drafted = 0
            for prompt in PROMPTS:
                result = speculator.generate(draft.tokenize(prompt), MAX_TOKENS)
                assert result.token_ids == references[prompt], f"k={k} diverged on {prompt!r}"
                accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
            client.close()
            if k is not None and close:  # blocks were verified, not just single tokens
                assert accepted > 0.4 * drafted, (accepted, drafted)
    finally:
        service.close()


@pytest.mark.parametrize("shape", ["1.5b", "7b"])
def test_the_real_models_head_layouts_match_hf_eager(shape):
    """Qwen2.5 1.5B's and 7B's attention layout (12 and 28 query heads on 2 and 4 key/value heads,
    head size 128, rope theta 1e6, tied and untied output heads) in two layers with random weights:
    a prompt and a block score within the tolerance of HF eager, with the same argmax."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from benchmarks.gpu import CONFIGS, EagerSession
    from remote_verify.backends.torch_static import StaticEngine

    torch.manual_seed(0)
    config = dict(CONFIGS[shape], num_hidden_layers=2, intermediate_size=256, vocab_size=1024)
    model = Qwen2ForCausalLM(Qwen2Config(**config, use_sliding_window=False)).eval()
    engine, eager = StaticEngine(model, slots=1, context=300), EagerSession(model)
    cache = engine.new_cache()
    rng = np.random.default_rng(0)
    for feed in (random_tokens(rng, 1024, 40), random_tokens(rng, 1024, 9)):
        reference = eager.forward(feed, len(feed))
        fast = engine.forward_many([Pass(cache, feed, len(feed))])[0]
        assert np.array_equal(reference.argmax(-1), fast.argmax(-1))
        assert float(np.abs(reference - fast).max()) < LOGIT_TOLERANCE
