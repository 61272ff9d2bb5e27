"""A stream's guesses: chains checked against the committed history, and how many a pass verifies."""

from __future__ import annotations

import random
import time

import pytest

from remote_verify.pass_costs import PassCosts
from remote_verify.stream_drafts import PRIOR_ACCEPTANCE, PassSoFar, StreamDrafts, best_block, tree_chances
from wire.draft_tree import GuessTree
from wire.cost_curve import interpolate
from wire.protocol import Draft

COMMITTED = [1, 2, 3, 4, 5, 6]  # the stream's history: prompt and tokens made so far


def test_a_chain_guessed_before_the_stream_passed_it_gives_what_lies_beyond():
    """Guesses for committed positions are checked; the ones past the history are the block."""
    drafts = StreamDrafts(seq=1)
    drafts.receive(Draft(seq=1, chain=1, start=4, tokens=[5, 6, 7, 8]))
    assert drafts.block(COMMITTED) == ([7, 8], "")


def test_a_chain_that_differs_where_the_stream_passed_is_dead_and_stays_dead():
    """A wrong guess for a committed position kills the chain; extending it gives nothing more."""
    drafts = StreamDrafts(seq=1)
    drafts.receive(Draft(seq=1, chain=1, start=4, tokens=[5, 9, 7]))
    assert drafts.block(COMMITTED) == ([], "")
    drafts.receive(Draft(seq=1, chain=1, start=7, tokens=[8]))
    assert drafts.block(COMMITTED) == ([], "")
    drafts.receive(Draft(seq=1, chain=2, start=6, tokens=[7, 8]))  # a new chain after the new text
    assert drafts.block(COMMITTED) == ([7, 8], "")


def test_a_chain_continued_before_its_dead_guess_lives_again():
    """Replacing the guesses from before the wrong one brings the chain back."""
    drafts = StreamDrafts(seq=1)
    drafts.receive(Draft(seq=1, chain=1, start=4, tokens=[5, 9, 7]))
    assert drafts.block(COMMITTED) == ([], "")
    drafts.receive(Draft(seq=1, chain=1, start=5, tokens=[6, 7, 8], source="ngram"))
    assert drafts.block(COMMITTED) == ([7, 8], "ngram")


def test_a_continuation_with_a_gap_or_of_another_stream_is_not_taken():
    """A Draft continuing its chain past the chain's end is refused with a reason; one of an
    ended stream is ignored."""
    drafts = StreamDrafts(seq=2)
    assert drafts.receive(Draft(seq=1, chain=1, start=6, tokens=[7])) == ""
    assert drafts.chain is None
    drafts.receive(Draft(seq=2, chain=1, start=6, tokens=[7]))
    assert "outside" in drafts.receive(Draft(seq=2, chain=1, start=9, tokens=[10]))
    assert drafts.block(COMMITTED) == ([7], "")


def test_a_refused_guess_kills_the_rest_of_its_chain_and_counts_in_the_acceptance():
    """After a pass kept 1 of 3 guesses, the chain gives nothing; the acceptance fell."""
    drafts = StreamDrafts(seq=1)
    drafts.receive(Draft(seq=1, chain=1, start=6, tokens=[7, 8, 9, 10]))
    before = drafts.acceptance
    block, _ = drafts.block(COMMITTED)
    drafts.after_pass(6, block[:3], accepted=1)
    assert drafts.block(COMMITTED + [7, 42]) == ([], "")
    assert drafts.acceptance < before


def test_a_tree_is_followed_down_the_committed_history_and_gives_what_lies_below():
    """A tree guessed at position 5: the history took 6 (its second child), so the pass's block is
    the tree below that node; a history that took a token no child guessed kills the tree."""
    drafts = StreamDrafts(seq=1)
    drafts.receive(Draft(seq=1, chain=1, start=5, tokens=[9, 6, 8, 7, 3], parents=[-1, -1, 0, 1, 1]))
    tree, _ = drafts.pending(COMMITTED)
    assert (tree.tokens, tree.parents) == ([7, 3], [-1, -1])
    assert drafts.acceptance > PRIOR_ACCEPTANCE  # the guess for position 5 was right
    tree, _ = drafts.pending(COMMITTED + [3])  # a later pass: the history went on through node 4
    assert tree.tokens == []
    assert drafts.chain.dead_at is None
    drafts.receive(Draft(seq=1, chain=2, start=5, tokens=[9, 8], parents=[-1, -1]))
    assert drafts.pending(COMMITTED)[0].tokens == [] and drafts.chain.dead_at == 0


def test_a_later_draft_of_a_trees_chain_replaces_the_tree():
    """A tree is not continued: a chain Draft with its number replaces it whole."""
    drafts = StreamDrafts(seq=1)
    drafts.receive(Draft(seq=1, chain=1, start=6, tokens=[7, 8], parents=[-1, -1]))
    drafts.receive(Draft(seq=1, chain=1, start=6, tokens=[9, 10]))
    assert drafts.chain.tree is None and drafts.block(COMMITTED) == ([9, 10], "")


def test_a_trees_nodes_are_priced_by_their_chance_of_being_kept():
    """A first child is kept as often as a chain's guess; its siblings share what it leaves; a
    node is kept only if its parent is."""
    tree = GuessTree([1, 2, 3, 4], [-1, -1, -1, 0])
    chances = tree_chances(tree, 0.8)
    assert chances[0] == pytest.approx(0.8) and chances[3] == pytest.approx(0.64)
    assert chances[1] == chances[2] == pytest.approx(0.2 * 0.8 / 2)
    flat = lambda n: interpolate([(1, 0.010), (33, 0.011)], n)  # noqa: E731
    assert best_block(4, 0.8, flat, 1, PassSoFar(), chances) == 4


def test_a_flat_cost_curve_verifies_every_guess_and_a_steep_one_few():
    """On a GPU-like curve (a pass of 33 tokens costs 1.1 of one) every guess likely to be reached is
    worth it; on a CPU-like curve (each token costs a step) only guesses almost sure to be right."""
    flat = lambda n: interpolate([(1, 0.010), (33, 0.011)], n)  # noqa: E731
    steep = lambda n: 0.060 * n  # noqa: E731
    assert best_block(16, 0.9, flat, 1, PassSoFar()) == 16
    assert 8 < best_block(16, 0.7, flat, 1, PassSoFar()) < 16  # the 16th is right 0.3% of the time
    assert best_block(16, 0.7, steep, 1, PassSoFar()) == 0
    assert best_block(16, 0.995, steep, 1, PassSoFar()) == 0  # a token a step: nothing to win, even when right
    cpu = lambda n: 0.060 + 0.035 * (n - 1)  # noqa: E731  (blocks cheaper per token than steps)
    assert 0 < best_block(16, 0.95, cpu, 1, PassSoFar()) < best_block(16, 0.995, cpu, 1, PassSoFar())


def test_in_a_shared_pass_blocks_shrink_where_the_device_is_compute_bound():
    """A pass already holding 31 sessions' tokens: a compute-bound curve (each token costs) takes
    fewer guesses of the 32nd session than the same session alone would."""
    compute = lambda n: interpolate([(1, 0.010), (64, 0.012), (512, 0.060)], n)  # noqa: E731
    alone = best_block(16, 0.8, compute, 1, PassSoFar())
    crowded = best_block(16, 0.8, compute, 1, PassSoFar(tokens=31 * 5, expected=31 * 3.0, sessions=31))
    assert crowded < alone


def test_unmeasured_costs_take_every_guess():
    """Before the curve is measured (no service calibration), the block is every guess."""
    assert best_block(5, 0.5, PassCosts().seconds, 1, PassSoFar()) == 5


def test_pass_costs_interpolate_between_sizes_and_follow_their_last_slope():
    """Measured sizes are kept as decayed means; between them the curve is linear, past them it
    continues along the last slope, and never below the first point."""
    costs = PassCosts()
    for n, seconds in ((1, 0.010), (4, 0.016), (8, 0.024)):
        costs.observe(n, seconds)
    assert abs(costs.seconds(2) - 0.012) < 1e-9 and abs(costs.seconds(16) - 0.040) < 1e-9
    assert costs.seconds(1) == costs.seconds(0) == 0.010
    assert [p.tokens for p in costs.curve()][:3] == [1, 2, 4]


def test_a_pass_of_as_many_members_has_a_curve_of_its_own():
    """Passes are timed by their members too: the curve of passes of about 64 members is not moved by
    passes of 128, and a count never timed is priced by the curve of every pass."""
    costs = PassCosts()
    for n in (64, 128, 192):
        costs.observe(n, (29 + 0.09 * max(0, n - 64)) / 1000, members=64)
    for n in (128, 192, 256):
        costs.observe(n, (41 + 0.09 * (n - 128)) / 1000, members=128)
    assert costs.shared(64).seconds(128) == pytest.approx(0.03476)
    assert costs.shared(70).seconds(128) == pytest.approx(0.03476)  # about as many: the same band
    assert costs.shared(128).seconds(128) == pytest.approx(0.041)
    assert 0.0348 < costs.seconds(128) < 0.0409  # every pass's: a mixture of the two
    assert costs.shared(8) is costs  # never timed


def test_a_noisy_curve_is_read_smoothed_and_keeps_rising_past_its_largest_size():
    """Shared passes come in many sizes, each timed a few times with noise: the curve read from them
    never falls, stays near the truth, and past the largest size grows at about the true slope, even
    where the last two sizes happened to time level (read raw, the next guesses there looked free)."""
    rng = random.Random(7)
    true = lambda n: (41 + 0.089 * (n - 128)) / 1000  # a 128-member pass of the emulated 70B target
    costs = PassCosts()
    for n in range(128, 299):
        costs.observe(n, true(n) * (1 + rng.uniform(-0.05, 0.05)), members=128)
    costs.observe(299, true(299) * 1.04, members=128)
    costs.observe(300, true(300) * 0.96, members=128)  # the largest size timed cheaper than the one before
    band = costs.shared(128)
    values = [band.seconds(n) for n in range(100, 700)]
    assert all(later >= earlier for earlier, later in zip(values, values[1:]))
    assert all(abs(band.seconds(n) / true(n) - 1) < 0.03 for n in range(140, 300, 10))
    slope = (band.seconds(700) - band.seconds(400)) / 300
    assert 0.5 * 0.089e-3 < slope < 1.5 * 0.089e-3, slope


def test_a_band_that_only_timed_guessing_passes_prices_its_plain_pass_below_them():
    """Passes of 128 members that all carry ten guesses each never time the members' plain pass (128
    tokens): it is priced along the curve's slope, not as dear as the smallest pass timed (which would
    tell every member's ledger that passes ten times as long cost it nothing)."""
    true = lambda n: (41 + 0.089 * (n - 128)) / 1000
    costs = PassCosts()
    for n in range(1300, 1600, 7):
        costs.observe(n, true(n), members=128)
    assert costs.shared(128).seconds(128) == pytest.approx(true(128), rel=0.02)
    assert costs.shared(128).seconds(1) >= true(1300) / 1300  # never below cost in proportion to tokens


def test_guesses_fill_what_the_pass_budget_leaves(llamacpp_target):
    """A stream's next pass must feed its last token; its guesses take only what the pass's token
    budget leaves (the queue fits streams by their last token, never leaving one out for guesses)."""
    from remote_verify.session import Session, SessionLimits
    from wire.protocol import Generate, SamplingParams

    session = Session(llamacpp_target, SamplingParams(), seed=1, limits=SessionLimits())
    session.start_generation(Generate(seq=1, committed_len=0, append=[1, 2, 3]))
    session.generate_step()
    drafts = StreamDrafts(seq=1)
    drafts.receive(Draft(seq=1, chain=1, start=len(session.committed), tokens=[5, 6, 7, 8, 9, 10, 11, 12]))
    work = session.stream_work(drafts, room=100)
    assert work.tokens() == 1  # the mandatory token alone
    planned = work.plan(PassSoFar(tokens=252, budget=256))
    assert len(planned.share.tokens) == 4  # 1 + 3 guesses
    planned.undo()
    planned = work.plan(PassSoFar(tokens=0, budget=256, share=2.0))  # many members: each its even share
    assert len(planned.share.tokens) == 1 + 2
    planned.undo()
    planned = work.plan(PassSoFar(tokens=0, budget=256, share=2.5))  # a fraction of a place rounds up
    assert len(planned.share.tokens) == 1 + 3
    planned.undo()
    session.close()


def typical_s(n: int) -> float:
    """The scripted backend's typical pass of n tokens."""
    return 0.01 + 0.001 * n


class ScriptedBackend:
    """A stand-in target for calibration whose pass of n tokens, its run-th of that size, sleeps
    `seconds(n, run)` (a real one cannot be slow or disturbed on cue); it counts the runs."""

    bos_id = 1

    def __init__(self, seconds):
        self.seconds = seconds
        self.runs: dict[int, int] = {}

    def new_cache(self):
        return object()

    def forward(self, cache, tokens, n_logits):
        n = len(tokens)
        run = self.runs[n] = self.runs.get(n, 0) + 1
        time.sleep(self.seconds(n, run))

    def truncate(self, cache, length):
        pass


def test_calibration_records_a_typical_pass_not_a_cold_or_disturbed_one():
    """The curve a Welcome carries is what clients decide to draft by: the first pass of each size
    (allocations) and one run taken by a neighbour must not make it. A stand-in backend whose
    passes take scripted times: each size's first run costs 20x, one later run 10x; the recorded
    cost is the typical one, within 3x. (A typical pass of about 10 ms: a busy machine oversleeps by
    milliseconds, which one of 2 ms did not survive.)"""
    costs = PassCosts()
    costs.calibrate(ScriptedBackend(lambda n, run: typical_s(n) * (20 if run == 1 else 10 if run == 3 else 1)))
    for n in (1, 2, 4, 8, 16):
        assert costs.seconds(n) < typical_s(n) * 3, (n, costs.seconds(n))  # a mean of the runs would be 4x


def test_a_slow_device_is_calibrated_in_one_timed_run_of_each_size():
    """A target whose passes take half a second (a large model on a CPU): after each size's
    first, unrecorded run, one timed run of each, not three (`serve` would wait seconds more
    before it listens); the curve still has every size."""
    backend, costs = ScriptedBackend(lambda n, run: 0.5), PassCosts()
    costs.calibrate(backend)
    assert {n: backend.runs[n] for n in (1, 2, 4, 8, 16)} == {1: 2, 2: 2, 4: 2, 8: 2, 16: 2}, backend.runs
    assert costs.sizes() == [1, 2, 4, 8, 16]
