"""The capacity bound's arithmetic: chain acceptance from a recording, pass budgets, users served."""

import subprocess
import sys

import pytest

from benchmarks.capacity_bound import Budget, Load, best_rate, chain_kept, paced_busy, user_rate, users_served
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


def test_prompts_read_in_the_passes_cost_users_in_both_modes():
    """Each reply's prompt is read in the passes: fewer users are served with prompts than without, and
    under a closed loop a mode that keeps guesses begins replies, and reads prompts, more often."""
    profile = load_target_profile("h100x2-70b-fp8")
    kept = [0.0, 0.87, 1.65, 2.36]
    bare, prompts = Load(), Load(prompt_tokens=38)
    assert user_rate(profile, kept, 64, 2, 200, prompts) < user_rate(profile, kept, 64, 2, 200, bare)
    for budget in (None, Budget(None)):
        assert users_served(profile, kept, 30.0, 200, budget, prompts) < users_served(profile, kept, 30.0, 200, budget, bare)
    plain_cost = user_rate(profile, kept, 64, 0, 200, bare) / user_rate(profile, kept, 64, 0, 200, prompts)
    guessing_cost = user_rate(profile, kept, 64, 2, 200, bare) / user_rate(profile, kept, 64, 2, 200, prompts)
    assert guessing_cost > plain_cost > 1.0


def test_paced_users_are_served_while_the_passes_they_need_fit_the_device():
    """A reply every 6 s: the users served are the most whose passes at the level's rate keep the device
    busy at most all the time, more than a closed loop holds (a user reading is in no pass), and with
    guesses more than without."""
    profile = load_target_profile("h100x2-70b-fp8")
    kept = [0.0, 0.87, 1.65, 2.36]
    paced = Load(pace_s=6.0, prompt_tokens=38)
    served = users_served(profile, kept, 30.0, 200, None, paced)
    assert paced_busy(profile, kept, served, 0, 200, paced, 30.0)[0] <= 1.0 < \
        paced_busy(profile, kept, served + 1, 0, 200, paced, 30.0)[0]
    # in the passes 96 / 30 s of each 6: nearly twice a closed loop's users (less the prompts they ask)
    assert served > 1.5 * users_served(profile, kept, 30.0, 200, None, Load(prompt_tokens=38))
    assert users_served(profile, kept, 30.0, 200, Budget(None), paced) > served
    # a faster rate costs more passes than it saves members: the level's rate is the cheapest
    assert paced_busy(profile, kept, served, 0, 200, paced, 45.0)[0] > paced_busy(profile, kept, served, 0, 200,
                                                                                 paced, 30.0)[0]


def test_a_pace_shorter_than_a_reply_is_refused_with_what_it_must_be():
    done = subprocess.run([sys.executable, "-m", "benchmarks.capacity_bound", "--reply-every", "2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "at least a reply's time at the level (3.2 s" in done.stderr
