"""The capacity search: users served at a service level, found by doubling then halving the gap."""

from types import SimpleNamespace

from benchmarks.service_level import ServiceLevel, search


def wave(users: int, capacity: int, first_token_s: float = 0.2):
    """A stand-in wave's record: every user at 30 tokens/s or more up to `capacity` users, slower past it."""
    slowest = 40.0 if users <= capacity else 25.0
    return SimpleNamespace(users=users, user_min_tok_s=slowest, first_token_p99_s=first_token_s, errors=[],
                           first_tokens=users)


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
