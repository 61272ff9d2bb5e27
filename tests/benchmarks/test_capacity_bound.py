"""The capacity bound's arithmetic: chain acceptance from a recording, pass budgets, users served."""

import pytest

from benchmarks.capacity_bound import Budget, best_rate, chain_kept, user_rate, users_served
from benchmarks.emulation.profiles import load_target_profile
from benchmarks.emulation.recording import Recorded, Recording


def test_a_chain_keeps_its_guesses_up_to_the_first_that_leaves_the_path():
    """Path 1 2 3 4, guesses 1 2 9 4: from each position the runs are 2, 1, 0, 1."""
    recording = Recording([Recorded("code", "t", [7], [1, 2, 3, 4], [1, 2, 9, 4], "eos")])
    kept = chain_kept(recording, max_tokens=96, longest=3)
    assert kept == [0.0, pytest.approx(3 / 4), pytest.approx(4 / 4), pytest.approx(4 / 4)]
    assert chain_kept(recording, max_tokens=2, longest=2) == [0.0, 1.0, pytest.approx(3 / 2)]  # path cut at 2


def test_budgets_read_as_the_service_applies_them():
    assert Budget.parse("256").allows(100, 256) and not Budget.parse("256").allows(100, 257)
    per_member = Budget.parse("member:4+256")
    assert per_member.allows(32, 256) and not per_member.allows(32, 257)  # 256 where that is more
    assert per_member.allows(100, 400) and not per_member.allows(100, 401)  # 4 a member where that is more
    assert Budget.parse("none").allows(1000, 10**6)
    with pytest.raises(ValueError, match="member:K"):
        Budget.parse("lots")


def test_users_served_is_the_most_users_at_the_level():
    """Server-only: the largest n whose plain pass gives each of n users the level; with guesses and no
    budget at least as many, and a budget that binds (a token a member: no guess fits) no more than
    server-only."""
    profile = load_target_profile("h100x2-70b-fp8")
    kept = [0.0, 0.87, 1.65, 2.36]
    served = users_served(profile, kept, 30.0, 200, None)
    assert user_rate(profile, kept, served, 0, 200) >= 30.0 > user_rate(profile, kept, served + 1, 0, 200)
    assert users_served(profile, kept, 30.0, 200, Budget(None)) > served
    assert users_served(profile, kept, 30.0, 200, Budget(0, 1)) == served
    rate, chain = best_rate(profile, kept, 64, 200, Budget(None))
    assert chain > 0 and rate > user_rate(profile, kept, 64, 0, 200)
