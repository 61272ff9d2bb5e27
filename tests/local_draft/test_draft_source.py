"""The choice between n-gram and model drafts, on hand-built contexts and measured costs."""

from __future__ import annotations

import pytest

from local_draft.adaptive_k import AdaptiveK, RoundTiming
from local_draft.draft_source import PRIOR_ALPHA_BY_N, SourceChoice

REPEATED = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 20, 1, 2, 3, 4, 5, 6, 7, 8]  # suffix of 8 seen before


def measured_controller(alpha_rounds: int = 6) -> AdaptiveK:
    """A controller that has seen model rounds: 10 ms per drafted token, verify 50 ms + 20 ms a token, 30 ms wire."""
    controller = AdaptiveK()
    for i in range(alpha_rounds):
        k = 2 + i % 3
        controller.observe(RoundTiming(k=k, accepted=k - 1, draft_s=0.01 * k, draft_tokens=k, fed_tokens=k + 1,
                                       service_s=0.05 + 0.02 * (k + 1), wire_s=0.03))
    return controller


def test_a_long_match_is_drafted_by_the_ngram_a_short_one_by_the_model():
    """Under the priors a match of 8 wins over the model; a match of 1 does not."""
    choice = SourceChoice("mixed")
    controller = measured_controller()
    long_plan = choice.plan(REPEATED, controller, None, model_k=controller.choose(16), cap=16)
    assert long_plan.source == "ngram" and long_plan.k > 0
    assert long_plan.proposal.tokens == [9, 10, 11, 12, 20, 1, 2, 3][: long_plan.k]
    short_plan = choice.plan([5, 6, 7, 1, 9, 1], controller, None, model_k=4, cap=16)  # "1" seen once: n = 1
    assert short_plan.source == "model" and short_plan.k == 4


def test_scoring_against_committed_tokens_moves_the_estimate_for_that_match_length():
    """Proposals that the target's tokens contradict pull alpha(n) down; ones it confirms pull it up."""
    choice = SourceChoice("mixed")
    controller = measured_controller()
    before = choice.alpha(8)
    for _ in range(8):
        choice.plan(REPEATED, controller, None, model_k=4, cap=16)
        choice.score([99, 98])  # the target went elsewhere at once
    assert choice.alpha(8, in_copy=0) < 0.1 < before
    assert choice.plan(REPEATED, controller, None, model_k=4, cap=16).source == "model"  # the threshold moved up
    for _ in range(10):
        choice.plan(REPEATED, controller, None, model_k=4, cap=16)
        choice.score([9, 10, 11, 12, 20])  # right for four tokens, then the target's own
    assert choice.alpha(8, in_copy=1) > 0.6  # after the first right copy, rounds count as in a copy
    assert choice.alpha(1, in_copy=0) == pytest.approx(PRIOR_ALPHA_BY_N[1])  # other lengths untouched


def test_ngram_alone_drafts_nothing_without_a_match_and_its_fixed_k_with_one():
    """--draft ngram: no match is a k = 0 round; with a fixed k a match drafts k tokens."""
    choice = SourceChoice("ngram")
    controller = AdaptiveK()
    assert choice.plan([1, 2, 3], controller, None, model_k=0, cap=16).k == 0
    plan = choice.plan(REPEATED, controller, 3, model_k=0, cap=3)
    assert plan.source == "ngram" and plan.proposal.tokens == [9, 10, 11]


def test_threshold_is_the_shortest_winning_match_length():
    """The threshold reported is where the rule switches from the model to the n-gram."""
    choice = SourceChoice("mixed")
    controller = measured_controller()
    threshold = choice.threshold(controller, model_k=4, cap=16)
    assert threshold is not None and threshold > 1

    def wins(n: int) -> bool:
        return (choice._best_ngram(controller, n, 16)[1] >= controller.expected_rate(4, controller.alpha)
                and choice.alpha(n) >= controller.alpha)

    assert wins(threshold) and not wins(threshold - 1)


def test_an_unknown_drafting_is_refused():
    """A typo in the drafting setting is an error naming the choices."""
    with pytest.raises(ValueError, match="model, ngram, mixed"):
        SourceChoice("ngrams")
