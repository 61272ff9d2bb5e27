"""The capacity search: users served at a service level, found by doubling then halving the gap."""

from types import SimpleNamespace

import pytest

from benchmarks.service_level import ServiceLevel, search


def wave(users: int, capacity: int, first_token_s: float = 0.2, rates: list[float] | None = None):
    """A stand-in wave's record: every user at 30 tokens/s or more up to `capacity` users, slower past it."""
    rates = rates if rates is not None else [40.0 if users <= capacity else 25.0] * users
    return SimpleNamespace(users=users, user_rates=sorted(rates), first_token_p99_s=first_token_s, errors=[],
                           first_tokens=users, pace_s=0.0, reply_rates=[])


def test_the_search_finds_the_last_count_that_holds_the_level():
    probed = []

    def probe(users):
        probed.append(users)
        return wave(users, capacity=37)

    served, records = search(probe, ServiceLevel(), start=4, limit=256, refine=3)
    assert probed == [4, 8, 16, 32, 64, 48, 40, 36] and served == 36  # within an eighth of the gap
    assert [r.users for r in records] == probed


def test_either_part_of_the_level_breaks_it():
    level = ServiceLevel(tok_s=30, first_token_s=1.0)
    assert level.met(wave(8, capacity=8))
    assert not level.met(wave(9, capacity=8))  # the slowest user under 30 tokens/s
    assert not level.met(wave(8, capacity=8, first_token_s=1.2))  # the first token's p99 over 1 s
    unmeasured = wave(8, capacity=8, first_token_s=0.0)
    unmeasured.first_tokens = 0  # no reply began in the window: its p99 of nothing is no first token at all
    assert not level.met(unmeasured)
    served, _ = search(lambda users: wave(users, capacity=1000), level, start=4, limit=64)
    assert served == 64  # never broken up to the limit: the limit (the table marks it 64+)
    served, _ = search(lambda users: wave(users, capacity=2), level, start=4, limit=64)
    assert served == 2  # broken at the first count: the gap below it is searched (4, then 2, then 3)


def test_the_level_is_read_at_the_users_percentile_it_names():
    # five users: the slowest under 30 tokens/s, the median over it
    mixed = wave(5, capacity=5, rates=[36.0, 22.0, 31.0, 40.0, 33.0])
    assert ServiceLevel().met(mixed)  # the median user (33 tokens/s) by default
    assert not ServiceLevel(users_percentile=0).met(mixed)  # every user: the slowest makes 22
    assert ServiceLevel(users_percentile=0).user_tok_s(mixed) == 22.0
    assert ServiceLevel(users_percentile=100).user_tok_s(mixed) == 40.0
    assert not ServiceLevel(tok_s=34).met(mixed)
    assert not ServiceLevel().met(wave(0, capacity=5, rates=[]))  # no user at all serves nobody
    assert "every user" in ServiceLevel(users_percentile=0).describe()
    assert "median" in ServiceLevel().describe()
    with pytest.raises(ValueError, match="percentile"):
        ServiceLevel(users_percentile=120)


def test_paced_users_are_read_over_their_replies():
    """Users paced a reply every so often idle between replies: the level reads their speed over their
    replies, not over the window (where a reply of 96 tokens every 8 s reads 12 tokens/s whatever the
    service)."""
    paced = wave(4, capacity=4, rates=[12.0, 12.0, 11.5, 12.0])
    paced.pace_s, paced.reply_rates = 8.0, [29.0, 33.0, 35.0, 40.0]
    assert ServiceLevel().met(paced) and ServiceLevel().user_tok_s(paced) == 35.0
    assert not ServiceLevel(users_percentile=0).met(paced)  # the slowest over its replies: 29
    assert ServiceLevel(tok_s=29, users_percentile=0).met(paced)
    paced.reply_rates = []  # no reply finished in the window: nothing to read the level from
    assert not ServiceLevel().met(paced)
    paced.pace_s = 0.0  # the same record unpaced: read over the window
    assert not ServiceLevel().met(paced) and ServiceLevel().user_tok_s(paced) == 12.0
