"""Sampling with trees of guesses is distributed as the target's: a chi-square test through the real protocol.

The default mode's client drafts a tree (local_draft/draft_tree.py) where the drafter is unsure: a
first choice and its alternatives, each grown below. The service walks it by the target's own pick
at each absolute position (the race of its warped distribution over the session's clocks), and
keeps a child only where it equals that pick (wire/draft_tree.py `walk`). Here the first two tokens
of SAMPLES seeded streams are tallied against the target's exact joint distribution: the first is
the prompt's pass (the tree's first level, drafted while it runs, is then matched against it), the
second is decided by the next pass, which walks the tree's second level, its branches side by
side in one pass (tree attention on the torch target, on an emulated device paced like a GPU).
The width is pinned (the controller's choice between trees and chains is not under test), so
every stream drafts trees.

Power (tests/statistics.py `detectable_shift` on this case's exact distribution, asserted below):
with SAMPLES draws the test catches a shift of POWER of probability mass between the two likeliest
outcomes 90% of the time. A planted bug of a tree's walk turns it red: node i's children checked
against the pass's row of its first child, not its own (an off-by-one between nodes and rows). The
issue's other planted tree bugs change the seeded text (tests/remote_verify/test_tree_drafts.py)
but move too little mass in the first two tokens to be caught here in a few hundred draws: a child
checked against its sibling's row (p = 0.73 at 400 draws: it bites only where the first child was wrong
and the second equals the other row's pick), clocks keyed by depth (p = 0.04 at 600: the first two
tokens then share clocks, a weak correlation), and a refused branch's KV (it changes the third
token on, after the second pass).

Cost on two shared cores: the case 32 s and the planted bug 15 s at a load average of about 14 (87 s
and 21 s at 20 to 30).
"""

from __future__ import annotations

import pytest

from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from remote_verify import session as session_module
from wire.draft_tree import ROOT
from wire.protocol import SamplingParams
from tests.conftest import RunningService, hello_for
from tests.forked_seeds import map_seeds, service_here
from tests.local_draft.test_sampling_exactness import Tally
from tests.statistics import ALPHA, detectable_shift

PARAMS = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
TOKENS = 2  # the first two tokens, jointly
SAMPLES = 600
POWER = 0.06  # detectable_shift(tally.exact, SAMPLES) is at most this (0.056), asserted below
# The planted bug draws the second token from the next position's distribution wherever a tree
# reached the pass (most streams): far more than POWER moves, and a few hundred draws find it.
PLANTED_SAMPLES = 300
PASS_MS = 12.0  # the emulated pass (1 node or 64): the drafter has the tree's second level ready in time
WIDTH = 4
CUDA_BATCH = {1: 1.0, 2: 1.1, 4: 1.25, 8: 1.6}  # llama.cpp PR #8215: 8 branches for 1.6x one (RTX 4090)


@pytest.fixture(scope="module")
def tree_service(tiny):
    """The tiny torch target (tree attention) on the emulated device, a target of its own."""
    from benchmarks.emulation.profiles import TargetProfile
    from benchmarks.emulation.target import EmulatedTarget
    from remote_verify.backends.torch_backend import TorchTarget

    profile = TargetProfile(name="tests-tree-sampling", pass_points=((1, PASS_MS), (64, PASS_MS * 1.1)))
    running = RunningService(EmulatedTarget(TorchTarget(tiny.target, device="cpu"), profile))
    yield running
    running.close()


def _pin_width(speculator: StreamSpeculator, width: int) -> None:
    controller = speculator.controller
    controller.batch_cost = dict(CUDA_BATCH)  # as measured on a GPU (this CPU's would say chains)
    controller.observe_guess_time(0.001)  # measured: the drafter makes a guess in a millisecond

    def pinned() -> int:
        controller.width = width
        return width

    controller.choose_width = pinned


def _tally(service, draft, samples: int, first_seed: int) -> tuple[Tally, int, int]:
    """`samples` seeded streams with trees; returns the tally, how many second tokens were kept
    guesses, and how many generations sent a tree that branched."""
    tally = Tally(service, draft, PARAMS, TOKENS)

    def generations(seeds: range) -> list:
        with service_here(service) as url:
            client = VerifyClient(url, hello_for(draft, PARAMS, seed=first_seed))
            sent, send = [], client.send_draft
            client.send_draft = lambda d: (sent.append(d), send(d))[1]
            speculator = StreamSpeculator(draft, client, PARAMS, seed=first_seed, colocated=False)
            _pin_width(speculator, WIDTH)
            made = []
            for seed in seeds:
                speculator.reseed(seed)
                marks: list[str] = []
                sent.clear()
                result = speculator.generate(tally.prompt, TOKENS + 1,
                                             lambda tokens, provenance: marks.extend(provenance))
                branched = any(len(set(d.parents)) < len(d.parents) for d in sent if d.parents)
                made.append((result, marks[1] == "draft", branched))
            client.close()
        return made

    kept = branched = 0
    for result, kept_guess, tree_branched in map_seeds(generations, range(first_seed, first_seed + samples), paced=True):
        kept += kept_guess
        branched += tree_branched
        tally.add(result)
    return tally, kept, branched


def test_sampled_streams_with_trees_follow_the_target_distribution(tree_service, close_draft):
    """The first two tokens of SAMPLES streams with trees fit the target's exact joint distribution."""
    tally, kept, branched = _tally(tree_service, close_draft, SAMPLES, 11_000_000)
    assert tally.pvalue() > ALPHA, tally.pvalue()
    # the path under test was taken: trees that branched, and second tokens that were kept guesses
    assert branched > SAMPLES / 2, branched
    assert kept > SAMPLES / 10, kept  # about 20% here: a guess must be ready within the prompt's pass
    assert detectable_shift(tally.exact, SAMPLES) <= POWER


def _walk_reading_a_nodes_pick_from_its_own_row(tree, pick, stops=frozenset()):
    """Planted: node i's children checked against the pick of pass row i + 2 (the row of node i's
    first child) instead of i + 1 (node i's own): "row i is node i", an off-by-one between a tree's
    nodes and the pass's rows, whose row 0 is the history's."""
    path, node = [], ROOT
    while True:
        token = pick(min(node + 2, len(tree.tokens)), len(path))
        child = tree.child_with(node, token)
        if child is None:
            return path, token
        path.append(child)
        node = child
        if tree.tokens[child] in stops:
            return path, None


def test_a_planted_tree_walk_bug_turns_the_test_red(tree_service, close_draft, monkeypatch):
    """A tree's children checked against the wrong row of the pass: the same test fails."""
    monkeypatch.setattr(session_module, "walk", _walk_reading_a_nodes_pick_from_its_own_row)
    tally, kept, branched = _tally(tree_service, close_draft, PLANTED_SAMPLES, 12_000_000)
    assert tally.pvalue() < ALPHA, (tally.pvalue(), kept, branched)
