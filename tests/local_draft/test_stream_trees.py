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
PASS_MS = 15.0  # the emulated device's pass, for 1 node or 64: a level of branches is ready in time
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


def test_without_trees_in_the_welcome_the_client_drafts_chains(paced_service, close_draft):
    """llama.cpp verifies a tree's first-choice path only (Welcome: no trees): chains, as before."""
    client = VerifyClient(paced_service.url, hello_for(close_draft))
    sent = _drafts_sent(client)
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), colocated=False)
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
    (the model leaves out the round trip a miss costs, which a wider tree saves); a level is priced by
    the leaves it wanted to grow, so where the drafter was sure (one leaf a level) a wide tree's level
    costs a chain's, and where it wanted all eight, eight branches' batch."""
    from local_draft.stream_controller import TREE_MARGIN

    controller = StreamController(curve=SEVENTY_B, colocated=False, trees=True, batch_cost=dict(CUDA_BATCH))
    controller.observe_guess_time(0.0026)
    chain = controller.gain(1)
    paying = [w for w in (2, 4, 8) if controller.gain(w) >= chain * TREE_MARGIN]
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
