"""The adaptive-k controller on simulated rounds: no models, no sockets."""

from __future__ import annotations

import numpy as np
import pytest

from local_draft.adaptive_k import (EXPLORE_EVERY, PROBE_EVERY, PROBE_K, REFRESH_EVERY, START_K, AdaptiveK,
                                    RoundTiming)


def simulate(controller: AdaptiveK, alpha: float, draft_token_s: float, step_s: float,
             verify_token_s: float, wire_s: float, rounds: int = 200, seed: int = 0) -> list[int]:
    """Run `rounds` rounds against a simulated pair; returns the k chosen each round.

    Acceptance is geometric with `alpha`; verify(k) = step_s + verify_token_s * k.
    """
    rng = np.random.default_rng(seed)
    chosen = []
    for _ in range(rounds):
        k = controller.choose(remaining=1000)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        controller.observe(RoundTiming(
            k=k, accepted=accepted, draft_s=draft_token_s * k, draft_tokens=k, fed_tokens=k + 1,
            service_s=step_s + verify_token_s * k, wire_s=wire_s))
        chosen.append(k)
    return chosen


def best_fixed_k(alpha, draft_token_s, step_s, verify_token_s, wire_s, max_k=16) -> int:
    def rate(k):
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
        return tokens / (draft_token_s * k + wire_s + step_s + verify_token_s * k)
    return max(range(max_k + 1), key=rate)


def test_first_rounds_use_the_starting_k_until_costs_are_measured():
    """Before anything is measured the controller drafts START_K (capped by what is left)."""
    controller = AdaptiveK()
    assert controller.choose(remaining=100) == START_K
    assert controller.choose(remaining=3) == 2  # the service adds one token of its own


@pytest.mark.parametrize("alpha, wire_s", [(0.95, 0.1), (0.9, 0.02), (0.5, 0.1), (0.3, 0.0)])
def test_settles_on_the_best_fixed_k(alpha, wire_s):
    """Drafting costs like this CPU's pair (36 ms/token; verify 67 ms + 20 ms/token):
    after a warm-up the controller picks the best fixed k (or a neighbour as good)."""
    costs = dict(draft_token_s=0.036, step_s=0.067, verify_token_s=0.02, wire_s=wire_s)
    chosen = simulate(AdaptiveK(), alpha, **costs)
    best = best_fixed_k(alpha, **costs)
    settled = np.median(chosen[100:])
    assert abs(settled - best) <= 2, (best, chosen[100:])


def test_stops_drafting_where_verifying_costs_as_much_as_decoding():
    """Zero round trip and costly verification (this CPU at 0 ms): k goes to 0."""
    chosen = simulate(AdaptiveK(), alpha=0.7, draft_token_s=0.036, step_s=0.067, verify_token_s=0.03,
                      wire_s=0.0)
    assert np.mean(np.array(chosen[50:]) == 0) > 0.9


def test_one_measured_block_size_does_not_make_longer_blocks_look_free():
    """After a single round (k = 4 on a CPU, 0.5 s to verify) the next block is not max_k:
    one block size gives no slope, and guessing a flat cost made every longer block free."""
    controller = AdaptiveK()
    controller.choose(remaining=1000)
    controller.observe(RoundTiming(k=4, accepted=4, draft_s=0.2, draft_tokens=4, fed_tokens=5,
                                   service_s=0.5, wire_s=0.001))
    assert controller.choose(remaining=1000) < START_K


def test_while_drafting_a_plain_decode_step_is_measured_now_and_then():
    """Every 2 * EXPLORE_EVERY drafting rounds one round drafts nothing, so the cost of a
    decode step is measured, not only extrapolated from long blocks."""
    chosen = simulate(AdaptiveK(), alpha=0.95, draft_token_s=0.005, step_s=0.02, verify_token_s=0.0005,
                      wire_s=0.1)
    zeros = [i for i, k in enumerate(chosen) if k == 0 and i >= 50]
    assert zeros, chosen
    gaps = np.diff(zeros)
    assert gaps.min() >= 2 * EXPLORE_EVERY - 1 and gaps.max() <= 2 * EXPLORE_EVERY + 1, zeros


def test_drafts_long_blocks_on_a_gpu_like_target_far_away():
    """Verification nearly free per token, 100 ms away, high acceptance: long blocks."""
    chosen = simulate(AdaptiveK(), alpha=0.95, draft_token_s=0.005, step_s=0.02, verify_token_s=0.0005,
                      wire_s=0.1)
    assert np.median(chosen[50:]) >= 12


def test_follows_a_change_from_code_to_prose():
    """Acceptance falls from 0.95 to 0.3 mid-reply: k falls within a few rounds."""
    controller = AdaptiveK()
    costs = dict(draft_token_s=0.036, step_s=0.067, verify_token_s=0.02, wire_s=0.1)
    high = simulate(controller, alpha=0.95, rounds=60, **costs)
    low = simulate(controller, alpha=0.3, rounds=30, seed=1, **costs)
    assert np.median(high[30:]) >= 4  # the rate is within 5% of its best from k = 4 to 10
    assert np.median(low[10:]) <= 2


def test_probes_from_zero_often_when_drafting_could_pay_and_rarely_otherwise():
    """At k = 0 a small probe comes every PROBE_EVERY rounds if optimism says drafting might pay;
    otherwise only every REFRESH_EVERY rounds, to notice costs that changed."""
    hopeful = simulate(AdaptiveK(), alpha=0.25, draft_token_s=0.036, step_s=0.067, verify_token_s=0.02,
                       wire_s=0.1, rounds=300)
    assert hopeful[100:].count(0) > 0.8 * 200
    assert hopeful[100:].count(PROBE_K) > 200 // REFRESH_EVERY + 1  # more than the refreshes alone
    assert PROBE_EVERY < REFRESH_EVERY
    hopeless = simulate(AdaptiveK(), alpha=0.45, draft_token_s=0.2, step_s=0.01, verify_token_s=0.05,
                        wire_s=0.0, rounds=300)
    assert set(hopeless[100:]) == {0, PROBE_K}
    assert hopeless[100:].count(PROBE_K) <= 200 // REFRESH_EVERY + 1


def rounds_of_a_reply(controller: AdaptiveK, alpha: float, rounds: int, seed: int = 0, **costs) -> list[tuple[int, int]]:
    """A new reply of `rounds` rounds at acceptance `alpha`: (k, accepted) of each."""
    controller.new_reply()
    rng, out = np.random.default_rng(seed), []
    for _ in range(rounds):
        k = controller.choose(remaining=1000)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        controller.observe(RoundTiming(k=k, accepted=accepted, draft_s=costs["draft_token_s"] * k, draft_tokens=k,
                                       fed_tokens=k + 1, service_s=costs["step_s"] + costs["verify_token_s"] * k,
                                       wire_s=costs["wire_s"]))
        out.append((k, accepted))
    return out


CPU_AT_0_MS = dict(draft_token_s=0.033, step_s=0.06, verify_token_s=0.035, wire_s=0.001)


def test_a_reply_of_prose_after_code_wastes_few_draft_tokens():
    """After a reply where every token was accepted, a reply at acceptance 0.3 starts with a block
    of at most START_K and throws away few drafted tokens: the last reply's acceptance is a
    starting point, not a certainty (before, the first block was 16 and alpha took a dozen rounds to fall)."""
    controller = AdaptiveK(pipelined=True)
    code = rounds_of_a_reply(controller, 1.0, 30, **CPU_AT_0_MS)
    assert max(k for k, _ in code) >= 8  # code earned long blocks
    prose = rounds_of_a_reply(controller, 0.3, 20, seed=1, **CPU_AT_0_MS)
    assert prose[0][0] <= START_K
    rejected = sum(k - accepted for k, accepted in prose)
    assert rejected <= 8, prose


def test_without_a_new_reply_the_old_acceptance_lingers():
    """The control: the same two texts as one reply (no new_reply between them) throw away more."""
    controller = AdaptiveK(pipelined=True)
    rounds_of_a_reply(controller, 1.0, 30, **CPU_AT_0_MS)
    rng, rejected = np.random.default_rng(1), 0
    for _ in range(20):
        k = controller.choose(remaining=1000)
        accepted = 0
        while accepted < k and rng.random() < 0.3:
            accepted += 1
        rejected += k - accepted
        controller.observe(RoundTiming(k=k, accepted=accepted, draft_s=0.033 * k, draft_tokens=k, fed_tokens=k + 1,
                                       service_s=0.06 + 0.035 * k, wire_s=0.001))
    assert rejected > 8


def test_a_block_grows_to_at_most_twice_what_the_last_got_right():
    """From START_K at a reply's start, each block at most 2 x (accepted + 1) of the drafting round before."""
    controller = AdaptiveK(pipelined=True)
    rounds = rounds_of_a_reply(controller, 0.8, 60, **dict(CPU_AT_0_MS, wire_s=0.1))
    assert rounds[0][0] <= START_K
    drafting = [(k, accepted) for k, accepted in rounds if k > 0]
    for (_, accepted), (k, _) in zip(drafting, drafting[1:]):
        assert k <= 2 * (accepted + 1), rounds
    controller = AdaptiveK(pipelined=True)
    rounds_of_a_reply(controller, 1.0, 20, **dict(CPU_AT_0_MS, wire_s=0.1))
    assert controller.choose(remaining=1000) >= 8  # long blocks on text that drafts perfectly
    controller.observe(RoundTiming(k=8, accepted=0, draft_s=0.26, draft_tokens=8, fed_tokens=9, service_s=0.34,
                                   wire_s=0.1))
    assert controller.choose(remaining=1000) <= 2  # a miss at the first token: the next block is short


def test_code_after_prose_is_probed_at_once():
    """After a reply that settled on k = 0, the next reply's first choice drafts a probe even where
    its starting acceptance says k = 0, and a text that drafts well goes on drafting."""
    controller = AdaptiveK(pipelined=True)
    prose = rounds_of_a_reply(controller, 0.05, 40, **CPU_AT_0_MS)
    assert [k for k, _ in prose[-10:]].count(0) >= 8
    assert controller.best_k((controller.alpha + 0.7) / 2, 4) == 0  # where the next reply starts: no drafting
    code = rounds_of_a_reply(controller, 1.0, 12, seed=2, **CPU_AT_0_MS)
    assert code[0][0] == PROBE_K
    assert all(k > 0 for k, _ in code[:4]), code


def test_a_one_token_step_is_timed_apart_from_blocks():
    """A service that runs blocks on more threads than steps (wire/threads.py): a step 60 ms,
    a block of n tokens 20 + 25 n ms. The step is predicted as measured, not from the block line."""
    controller = AdaptiveK()
    for k in [0, 4, 0, 2, 6, 0, 4, 2]:
        controller.observe(RoundTiming(k=k, accepted=k, draft_s=0.03 * k, draft_tokens=k, fed_tokens=k + 1,
                                       service_s=0.06 if k == 0 else 0.02 + 0.025 * (k + 1), wire_s=0.001))
    assert controller.verify_s(1) == pytest.approx(0.06)
    assert controller.verify_s(5) == pytest.approx(0.145, rel=0.02)
