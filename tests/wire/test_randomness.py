"""What a seed means: independent streams for drafter and service, service draws keyed by position."""

from __future__ import annotations

import numpy as np

from wire.randomness import Decision, DecisionRandomness, draft_generator, fresh_seed, seed_problem


def test_a_service_draw_depends_on_seed_position_and_decision_only():
    """The same (seed, position, decision) gives the same number in any order, in any session."""
    one, two = DecisionRandomness(7), DecisionRandomness(7)
    forward = [one.at(n, Decision.ACCEPT).random() for n in range(50)]
    backward = [two.at(n, Decision.ACCEPT).random() for n in reversed(range(50))][::-1]
    assert forward == backward
    assert one.at(3, Decision.TOKEN).random() == two.at(3, Decision.TOKEN).random()


def test_positions_decisions_and_seeds_draw_independent_numbers():
    """Uniforms across positions, the two decisions and nearby seeds are distinct and uncorrelated."""
    one = DecisionRandomness(7)
    accept = np.array([one.at(n, Decision.ACCEPT).random() for n in range(4000)])
    token = np.array([one.at(n, Decision.TOKEN).random() for n in range(4000)])
    other = np.array([DecisionRandomness(8).at(n, Decision.ACCEPT).random() for n in range(4000)])
    assert len(set(accept) | set(token) | set(other)) == 12_000
    for a, b in ((accept, token), (accept, other), (accept[:-1], accept[1:])):
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.06  # 4 standard errors at n = 4000
    assert abs(accept.mean() - 0.5) < 0.02


def test_a_generator_for_one_position_never_runs_into_the_next():
    """Many draws at position n share no number with position n + 1 (the counter's low word advances)."""
    one = DecisionRandomness(1)
    many = one.at(10, Decision.TOKEN).random(10_000)
    assert not set(many) & set(one.at(11, Decision.TOKEN).random(10_000))


def test_the_drafter_stream_is_not_the_service_stream():
    """One user seed gives the drafter numbers unlike both the service's and default_rng(seed)'s."""
    drafted = draft_generator(5).random(100)
    assert (drafted == draft_generator(5).random(100)).all()
    service = [DecisionRandomness(5).at(n, what).random() for n in range(100) for what in Decision]
    assert not set(drafted) & set(service)
    assert not set(drafted) & set(np.random.default_rng(5).random(100))


def test_no_seed_means_fresh_entropy_on_each_end():
    """A seed of None: two sessions, and two drafters, draw different numbers."""
    assert DecisionRandomness(None).seed != DecisionRandomness(None).seed
    assert draft_generator(None).random() != draft_generator(None).random()
    assert 0 <= fresh_seed() < 2**64


def test_seeds_outside_64_bits_are_named():
    """The wire carries 64-bit seeds: negative or larger ones are described, None and the range pass."""
    assert seed_problem(None) == seed_problem(0) == seed_problem(2**64 - 1) == ""
    assert "2**64 - 1" in seed_problem(-1) and "2**64 - 1" in seed_problem(2**64)
