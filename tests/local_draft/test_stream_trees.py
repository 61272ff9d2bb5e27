"""The default mode with trees of guesses: the target's text, trees only where the service verifies them."""

from __future__ import annotations

import pytest

from local_draft.server_only import ServerOnlyGenerator
from local_draft.stream_controller import StreamController
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from wire.protocol import PassCost, SamplingParams
from tests.conftest import RunningService, hello_for

PROMPTS = ["def quicksort(arr):", "The quick brown fox", "SELECT * FROM users WHERE", "x = ["]
MAX_TOKENS = 24
PASS_MS = 60.0  # the emulated device's pass, for 1 node or 64: a level of branches is ready in time even
# where a busy machine makes the drafter's guess 3 ms (at 15 ms a pass, CI once chose chains there)
CUDA_BATCH = {1: 1.0, 2: 1.1, 4: 1.25, 8: 1.6}  # llama.cpp PR #8215: 8 branches for 1.6x one (RTX 4090)
METAL_BATCH = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}  # each branch a pass (PR #29110, #10491)
SEVENTY_B = [PassCost(tokens=1, ms=18.6), PassCost(tokens=64, ms=18.6 * 1.27)]  # NIM 1.8.0 / SGLang #22520


@pytest.fixture(scope="module")
def tree_service(tiny):
    """The tiny torch target (tree attention) on the emulated device: passes of PASS_MS. A target of
    its own: `torch_target` is served by `service_on("torch")` (a loaded target has one service)."""
    from benchmarks.emulation.profiles import TargetProfile
    from benchmarks.emulation.target import EmulatedTarget
    from remote_verify.backends.torch_backend import TorchTarget

    profile = TargetProfile(name="tests-stream-trees", pass_points=((1, PASS_MS), (64, PASS_MS * 1.1)))
    running = RunningService(EmulatedTarget(TorchTarget(tiny.target, device="cpu"), profile))
    yield running
    running.close()


def _drafts_sent(client: VerifyClient) -> list:
    """Every Draft the client sends, kept as it goes out."""
    sent, send = [], client.send_draft

    def keep(draft):
        sent.append(draft)
        send(draft)

    client.send_draft = keep
    return sent


def _paths(draft) -> set[tuple[int, ...]]:
    """The paths from the root of a Draft's tree to each of its nodes (the same tree in any order)."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(draft.tokens, draft.parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return set(paths)


def _reference(url: str, draft) -> dict[str, list[int]]:
    client = VerifyClient(url, hello_for(draft))
    streamed = ServerOnlyGenerator(client, draft.end_ids)
    out = {prompt: streamed.generate(draft.tokenize(prompt), MAX_TOKENS).token_ids for prompt in PROMPTS}
    client.close()
    return out


@pytest.mark.parametrize("drafter", ["close_draft", "far_draft"])
def test_greedy_with_trees_is_the_target_alone(request, tree_service, drafter):
    """A drafter priced as a CUDA one drafts trees where the service verifies them: the text is the
    target's alone, token for token; the close drafter's trees branch, and kept guesses make the
    text in fewer passes than tokens (the far one is seldom right: it may rest)."""
    draft = request.getfixturevalue(drafter)
    reference = _reference(tree_service.url, draft)
    client = VerifyClient(tree_service.url, hello_for(draft))
    sent = _drafts_sent(client)
    speculator = StreamSpeculator(draft, client, SamplingParams(), colocated=False)
    speculator.controller.batch_cost = dict(CUDA_BATCH)  # as measured on a GPU (this CPU's would say chains)
    made = passes = 0
    for prompt in PROMPTS:
        result = speculator.generate(draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == reference[prompt], prompt
        made, passes = made + len(result.token_ids), passes + result.stats.rounds
    client.close()
    assert client.welcome.trees and speculator.controller.trees
    if drafter == "close_draft":
        assert any(d.parents and len(set(d.parents)) < len(d.parents) for d in sent), "no tree with a branch"
        assert passes < made, (passes, made)


def test_a_seeded_sampled_stream_with_trees_is_the_seeds_text(tree_service, close_draft):
    """Sampling with a seed, trees on: the tokens the stream alone commits with that seed."""
    params, seed = SamplingParams(temperature=0.9, top_k=20, top_p=0.95), 5
    client = VerifyClient(tree_service.url, hello_for(close_draft, params, seed=seed))
    streamed = ServerOnlyGenerator(client, close_draft.end_ids)
    streamed.reseed(seed)
    expected = streamed.generate(close_draft.tokenize(PROMPTS[0]), MAX_TOKENS).token_ids
    client.close()
    client = VerifyClient(tree_service.url, hello_for(close_draft, params, seed=seed))
    speculator = StreamSpeculator(close_draft, client, params, seed=seed, colocated=False)
    speculator.controller.batch_cost = dict(CUDA_BATCH)
    assert speculator.generate(close_draft.tokenize(PROMPTS[0]), MAX_TOKENS).token_ids == expected
    client.close()


@pytest.mark.parametrize("sampled", [False, True])
def test_a_tree_at_its_node_limit_drops_leaves_and_the_text_is_the_targets(tree_service, close_draft, monkeypatch,
                                                                         sampled):
    """Trees of 8 held to 12 nodes: every few levels the client's tree is full and drops its least likely
    leaves (local_draft/draft_tree.py `_prune`), so the service receives, under one chain number, trees
    that are not the one before plus nodes. The text is still the target's alone (greedy) or the seed's
    (sampled), and the guesses still save passes."""
    import local_draft.draft_tree as draft_tree

    monkeypatch.setattr(draft_tree, "MAX_TREE_NODES", 12)
    params, seed = (SamplingParams(temperature=0.9, top_k=20, top_p=0.95), 5) if sampled else (SamplingParams(), None)
    client = VerifyClient(tree_service.url, hello_for(close_draft, params, seed=seed))
    streamed = ServerOnlyGenerator(client, close_draft.end_ids)
    expected = {}
    for prompt in PROMPTS:
        if sampled:
            streamed.reseed(seed)
        expected[prompt] = streamed.generate(close_draft.tokenize(prompt), MAX_TOKENS).token_ids
    client.close()
    client = VerifyClient(tree_service.url, hello_for(close_draft, params, seed=seed))
    sent = _drafts_sent(client)
    speculator = StreamSpeculator(close_draft, client, params, seed=seed, colocated=False)
    speculator.controller.batch_cost = dict(CUDA_BATCH)
    speculator.controller.pinned_width = 8
    made = passes = 0
    for prompt in PROMPTS:
        if sampled:
            speculator.reseed(seed)
        result = speculator.generate(close_draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == expected[prompt], prompt
        made, passes = made + len(result.token_ids), passes + result.stats.rounds
    client.close()
    assert max(len(d.tokens) for d in sent) == 12
    pruned = [(a.chain, a.start) for a, b in zip(sent, sent[1:]) if a.parents and b.parents and a.chain == b.chain
              and a.start == b.start and not _paths(a) <= _paths(b)]
    assert pruned, "no full tree dropped a leaf"
    assert passes < made, (passes, made)


def test_without_trees_in_the_welcome_the_client_drafts_chains(paced_service, close_draft):
    """llama.cpp verifies a tree's first-choice path only (Welcome: no trees): chains, as before."""
    client = VerifyClient(paced_service.url, hello_for(close_draft))
    sent = _drafts_sent(client)
    # `--k 4`: drafting whatever the rates say (left to them, a busy machine may rest the drafter, and
    # a test of what is drafted then sees nothing drafted)
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), colocated=False, max_block=4)
    speculator.controller.batch_cost = dict(CUDA_BATCH)
    speculator.generate(close_draft.tokenize(PROMPTS[0]), MAX_TOKENS)
    client.close()
    assert not client.welcome.trees and not speculator.controller.trees
    assert sent and all(not d.parents for d in sent)


def test_branches_that_cost_a_pass_each_draft_chains():
    """On a 70B-class curve, a drafter whose every branch costs a guess (Apple Metal) drafts chains;
    one whose 8 branches cost 1.6 guesses (CUDA) drafts a tree."""
    metal = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(METAL_BATCH))
    metal.observe_guess_time(0.0051)
    assert metal.choose_width() == 1
    cuda = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(CUDA_BATCH))
    cuda.observe_guess_time(0.0026)
    assert cuda.choose_width() > 1 and cuda.gain(cuda.width) > cuda.gain(1)
    cuda.trees = False  # the service verifies no trees
    assert cuda.choose_width() == 1


def test_the_widest_tree_that_pays_is_drafted_and_a_sure_drafter_makes_it_cheap():
    """Among the widths whose trees beat the chain by TREE_MARGIN in the model, the widest is drafted
    (the round trip a miss costs is in the model; the miss's other price, a tree's alternatives grown
    too shallow to carry the stream, is not); a level is priced by
    the leaves it wanted to grow, so where the drafter was sure (one leaf a level) a wide tree's level
    costs a chain's, and where it wanted all eight, eight branches' batch."""
    from local_draft.stream_controller import TREE_MARGIN

    controller = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(CUDA_BATCH))
    controller.observe_guess_time(0.0026)
    chain = controller.gain(1, stream=True)
    paying = [w for w in (2, 4, 8) if controller.gain(w, stream=True) >= chain * TREE_MARGIN]
    assert paying and controller.choose_width() == max(paying)
    for _ in range(50):
        controller.observe_level(1)
    assert controller.level_cost(8) == pytest.approx(1.0)
    sure = controller.gain(8)
    for _ in range(50):
        controller.observe_level(8)
    assert controller.level_cost(8) == pytest.approx(CUDA_BATCH[8], rel=0.01)
    assert controller.gain(8) < sure  # eight branches a level: the tree reaches less deep in a pass
    assert controller.level_cost(2) == pytest.approx(CUDA_BATCH[2], rel=0.01)  # never more than its width


def test_a_miss_costs_a_round_trip_of_passes_alone_which_a_tree_saves():
    """The width is chosen counting the passes the service runs alone after a miss (a round trip of
    them): where one pass's tokens say a chain (every tree under TREE_MARGIN), a miss's round trip says
    a tree, the more so the farther the service; a drafter sure of its guesses still drafts chains."""
    from local_draft.stream_controller import TREE_MARGIN

    def controller(rtt_s: float, right: int, tested: int, then_right: int = 0) -> StreamController:
        made = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(CUDA_BATCH))
        made.observe_guess_time(0.0026)
        made.observe_wire(rtt_s)
        for _ in range(30):
            made.observe_guesses(right, tested)
        made.observe_guesses(then_right, then_right)
        return made

    near, far = controller(0.014, 9, 10), controller(0.100, 9, 10)
    a = near.steady_acceptance  # about 0.9: what the width is chosen by
    assert a == pytest.approx(0.9, abs=0.02) and far.steady_acceptance == pytest.approx(a)
    assert near.blind_passes(0.0186) == pytest.approx((0.014 + 0.0026) / 0.0186 + 0.5)
    assert far.blind_passes(0.0186) > 5
    assert all(near.gain(w, a) < near.gain(1, a) * TREE_MARGIN for w in (2, 4, 8))  # one pass: a chain
    assert near.modelled_width() > 1 and far.modelled_width() > 1

    def tree_over_chain(made: StreamController) -> float:
        return made.gain(8, a, stream=True) / made.gain(1, a, stream=True)

    assert tree_over_chain(far) > tree_over_chain(near)  # the farther the service, the more a tree saves
    assert controller(0.014, 20, 20).modelled_width() == 1  # a miss is rare: the chain's deeper reach wins
    # the width goes by the last fifty guesses, not the last seven: a run of right guesses since the
    # last miss (the last seven read 0.995) leaves the tree a tree
    after_a_run = controller(0.014, 9, 10, then_right=12)
    assert after_a_run.acceptance > 0.97 and after_a_run.steady_acceptance < 0.93
    assert after_a_run.modelled_width() > 1


def test_a_tree_the_drafter_cannot_keep_ahead_of_the_stream_or_that_ends_at_leaves_is_worth_less():
    """A pass keeps at most the levels drafted during one (the stream's own token takes a level too):
    with Apple's batch cost (4 sequences 2.1 steps, 8 about 3.6) and a drafter that wants 8 leaves a
    level, a tree of 8 reaches less than a level a pass and gains nothing, so the tree narrows: to two
    branches at most where the drafter misses often, to a chain where it does not; and a tree whose
    caught misses were left leaves (the stream's guesses end there as at a miss) is worth less than
    one that went on below them."""
    apple = {1: 1.0, 2: 1.37, 4: 2.1, 8: 3.57}  # benchmarks/emulation/profiles/apple-m5-0.5b.toml
    for right in (1, 3, 9):
        metal = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(apple))
        metal.observe_guess_time(0.0051)
        metal.observe_wire(0.014)
        for _ in range(30):
            metal.observe_guesses(right, right + 1)
        for _ in range(30):  # then trees, whose levels wanted 8 leaves
            metal.observe_level(8)
        assert metal.gain(8, stream=True) == pytest.approx(1.0, abs=0.02)
        assert metal.modelled_width() <= (2 if right < 9 else 1)

    def tree_that_carried(carried: int) -> StreamController:
        made = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(CUDA_BATCH))
        made.observe_guess_time(0.0026)
        made.observe_wire(0.014)
        for _ in range(30):
            made.observe_tree_levels(first_right=3, alternate_right=1, tested=4, width=8, carried=carried)
        return made

    went_on, left = tree_that_carried(1), tree_that_carried(0)
    assert went_on.carried_share > 0.95 and left.carried_share < 0.05
    assert left.gain(8, stream=True) < went_on.gain(8, stream=True) * 0.95
    assert left.gain(1, stream=True) == pytest.approx(went_on.gain(1, stream=True))  # a chain has no alternatives


def test_a_chains_guesses_say_what_a_trees_level_would_cost():
    """While chains are drafted no tree measures what its levels want: a chain's right guesses count as
    one leaf (the drafter was sure), its misses as every branch, so a tree's level priced after prose
    (many leaves) comes down on code drafted as chains, and the tree is tried again."""
    controller = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(CUDA_BATCH))
    controller.observe_guess_time(0.0026)
    controller.observe_wire(0.014)
    for _ in range(30):  # prose: trees whose levels wanted 30 leaves
        controller.observe_level(30)
    assert controller.level_cost(8) == pytest.approx(CUDA_BATCH[8], rel=0.01)
    for _ in range(10):  # code, drafted as chains: one miss in twenty
        controller.observe_guesses(19, 20)
    assert controller.level_cost(8) < 1.15  # against 1.6
    assert controller.modelled_width() == 8  # and the tree is drafted again
    for _ in range(10):  # prose again: every other guess wrong
        controller.observe_guesses(1, 2)
    assert controller.level_cost(8) > 1.3


def test_the_passes_a_miss_costs_are_counted_and_weigh_the_width():
    """After a miss the client counts the frames whose pass verified no guess until one did; the
    controller weighs a tree by that count once it has one (before, by the round trip): where the
    stream ran two such passes a miss and the round trip says 1.4, a tree saves more."""
    from types import SimpleNamespace

    controller = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(CUDA_BATCH))
    controller.observe_guess_time(0.0026)
    controller.observe_wire(0.014)
    for _ in range(30):
        controller.observe_guesses(9, 10)
    a = controller.steady_acceptance
    assert controller.blind_passes(0.0186) == pytest.approx((0.014 + 0.0026) / 0.0186 + 0.5)
    before = controller.gain(8, a, stream=True) / controller.gain(1, a, stream=True)
    client = SimpleNamespace(_blind=None, controller=controller)
    for _ in range(20):  # a pass that found a miss, two that verified nothing, then guesses again
        for drafted, missed in ((3, True), (0, False), (0, False), (4, False)):
            StreamSpeculator._count_blind(client, drafted, missed)
    assert controller.blind_passes(0.0186) == pytest.approx(2.0)
    assert controller.gain(8, a, stream=True) / controller.gain(1, a, stream=True) > before


def test_a_pinned_width_is_kept_where_trees_are_verified_and_chains_elsewhere():
    """A width fixed from outside (`benchmarks.load --modes trees4`) holds even where the costs
    favour chains (Metal's branches), and gives way to chains where the service verifies none."""
    controller = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(METAL_BATCH),
                                  pinned_width=4)
    controller.observe_guess_time(0.0051)
    assert controller.modelled_width() == 1 and controller.choose_width() == 4
    for _ in range(100):
        controller.observe_frame(2, 0.020, True)
        assert controller.choose_width() == 4
    controller.trees = False
    assert controller.choose_width() == 1
