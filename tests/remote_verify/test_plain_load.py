"""The plain streams server-only would run under the same users (remote_verify/plain_load.py): the fairness
ledger's counterfactual. Sessions' replies are fed as the queue feeds them after each pass, a token in 10 ms
(guesses kept); a plain pass of n streams costs c(n) = 20 + 0.1 n ms (a GPU's flat curve), so under
server-only each reply would last twice as long or more."""

from __future__ import annotations

import pytest

from remote_verify.plain_load import FORGET_CYCLES, PlainLoad

LENGTHS = (96, 64, 128, 80, 112)  # replies' tokens, one after another


def plain_pass_s(streams: int) -> float:
    return (20 + 0.1 * streams) / 1000


TOKEN_S = 0.01  # a reply's token here


def reply(load: PlainLoad, session, tokens: int, began: float) -> float:
    """One reply of `tokens` tokens from `began`, a pass a token; returns when its last pass ended."""
    load.member(session, True, 1.0, began, began + TOKEN_S)  # the prompt and first token
    for step in range(1, tokens):
        load.member(session, False, 1.0, began + TOKEN_S * step, began + TOKEN_S * (step + 1))
    return began + TOKEN_S * tokens


def reading(load: PlainLoad, session, gap_s: float, count: int, start: float = 0.0) -> float:
    """`count` replies, each asked `gap_s` after the last ended (a user who reads); returns the last's end."""
    ended = start - gap_s
    for i in range(count):
        ended = reply(load, session, LENGTHS[i % len(LENGTHS)], ended + gap_s)
    return ended


def scheduled(load: PlainLoad, session, cycle_s: float, count: int, start: float = 0.0) -> float:
    """`count` replies, one every `cycle_s` whatever they took (a user on a schedule); returns the last's end."""
    ended = start
    for i in range(count):
        ended = reply(load, session, LENGTHS[i % len(LENGTHS)], start + i * cycle_s)
    return ended


def fixed_point(shares) -> float:
    """The n with n = shares(c(n)), by bisection."""
    low, high = 0.0, 10_000.0
    for _ in range(100):
        middle = (low + high) / 2
        if shares(plain_pass_s(round(middle))) > middle:
            low = middle
        else:
            high = middle
    return low


def test_a_closed_loop_runs_the_members_it_has():
    """Users who ask again the moment a reply ends (a 14 ms round trip between replies): server-only keeps
    every one of them in a reply all the time, as this service does; the plain pass is the members', also
    when two are in their round trip (they would be under server-only too)."""
    load = PlainLoad()
    ends = [reading(load, user, 0.014, 5) for user in range(32)]
    now = max(ends)
    assert load.streams(set(range(32)), plain_pass_s, now) == pytest.approx(32, abs=0.5)
    assert load.streams(set(range(30)), plain_pass_s, now) == pytest.approx(30, abs=0.5)


def test_users_who_read_between_replies_keep_more_streams_open_under_server_only():
    """200 users reading 4 s after each reply, 10 of them in a reply now: under server-only each is in a
    reply L c / (L c + 4) of the time, here R / (R + 4) (R: its replies' seconds here); server-only's
    streams are the members and the sum of the difference, at c of their number: far more than 10."""
    load = PlainLoad()
    for user in range(200):  # five replies each, the last ended a second or two ago (under their gap)
        reading(load, user, 4.0, 5, start=-21.0 - user * 0.005)
    members = set(range(10))
    for user in members:
        load.member(user, True, 1.0, 0.0, TOKEN_S)
    habit = load._habits[100]  # (a member's counts the reply it ended before this one too)
    length, here = habit.tokens.mean, habit.reply_s
    expected = fixed_point(lambda c: 10 + 200 * (length * c / (length * c + 4.0) - here / (here + 4.0)))
    streams = load.streams(members, plain_pass_s, TOKEN_S)
    assert streams == pytest.approx(expected, abs=3)
    assert streams > 40


def test_users_on_a_schedule_are_counted_by_their_cycle_not_by_the_gap_left_here():
    """100 users asking every 4 s: here their replies (0.6 to 1.3 s) leave gaps of 2.7 to 3.4 s, but under
    server-only a reply of L tokens at c a token leaves 4 - L c. Counted by the gaps seen here (planted:
    every user taken as a reader) the estimate falls short of server-only's streams."""
    load = PlainLoad()
    for user in range(100):
        scheduled(load, user, 4.0, 5, start=-17.0 - user * 0.005)
    assert all(habit.scheduled for habit in load._habits.values())
    habit = load._habits[0]
    length, here, gap, cycle = habit.tokens.mean, habit.reply_s, habit.gap.mean, habit.cycle.mean
    expected = fixed_point(lambda c: 100 * (min(1.0, length * c / cycle) - here / cycle))
    streams = load.streams(set(), plain_pass_s, 0.0)
    assert streams == pytest.approx(expected, abs=3)
    as_readers = fixed_point(lambda c: 100 * (length * c / (length * c + gap) - here / cycle))
    assert streams > as_readers + 5


def test_a_session_quiet_past_its_habit_counts_less_and_is_then_forgotten():
    """A user who stops asking: counted with a gap as long as it has been quiet, gone after FORGET_CYCLES cycles."""
    load = PlainLoad()
    last = reading(load, "reader", 1.0, 5)
    busy = load.streams(set(), plain_pass_s, last + 1.0)
    quieter = load.streams(set(), plain_pass_s, last + 10.0)
    assert 0 < quieter < busy
    cycle = load._habits["reader"].cycle.mean
    assert load.streams(set(), plain_pass_s, last + FORGET_CYCLES * cycle + 1.0) == 0
    assert "reader" not in load._habits


def test_a_session_in_its_first_reply_counts_only_while_it_is_a_member():
    load = PlainLoad()
    reply(load, "new", 10, 0.0)
    assert load.streams({"new"}, plain_pass_s, 0.25) == 1
    assert load.streams(set(), plain_pass_s, 0.25) == 0


def test_a_prompt_in_pieces_is_one_reply_start():
    """Passes that feed a prompt's pieces (each `starting`) begin one reply: its gap is from the last reply's
    end to the first piece, its cycle from the last reply's first pass."""
    load = PlainLoad()
    ended = reply(load, "user", 10, 0.0)  # ends at 0.1
    for piece in range(3):  # the next prompt in three pieces, from 2.1
        load.member("user", True, 0.0, ended + 2.0 + 0.02 * piece, ended + 2.02 + 0.02 * piece)
    habit = load._habits["user"]
    assert habit.tokens.mean == 10
    assert habit.gap.mean == pytest.approx(2.0) and habit.cycle.mean == pytest.approx(2.1)


def asking(load: PlainLoad, session, asks_s, start: float = 0.0, wait_s: float = 0.005) -> float:
    """Replies each asked `asks_s[i]` after the last ended, its request reaching the queue then and its first
    pass beginning `wait_s` later (the rest of the pass it landed in); returns the last reply's end."""
    ended = start
    for i, ask_s in enumerate(asks_s):
        came = ended + ask_s
        began = came + wait_s
        tokens = LENGTHS[i % len(LENGTHS)]
        load.member(session, True, 1.0, began, began + TOKEN_S, came)
        for step in range(1, tokens):
            load.member(session, False, 1.0, began + TOKEN_S * step, began + TOKEN_S * (step + 1))
        ended = began + TOKEN_S * tokens
    return ended


def test_a_program_that_asks_a_round_trip_after_each_reply_is_due_in_the_pass_after_its_last():
    """A closed loop behind a 14 ms round trip: once a reply's request has come 14 ms after the last one ended,
    the pass formed as the next reply ends (20 ms long) is due to see its request land; a pass formed later, or
    one while the session is in the queue, is not."""
    load = PlainLoad()
    ended = asking(load, "agent", [0.014, 0.014, 0.0145])
    assert load.due(set(), ended, ended + 0.020)
    assert not load.due({"agent"}, ended, ended + 0.020)  # its request is here: no longer expected
    assert not load.due(set(), ended + 0.040, ended + 0.060)  # overdue by far more than its while ever spread
    assert not load.due(set(), ended - 0.050, ended - 0.040)  # long before


def test_a_reader_and_a_newcomer_are_never_due():
    """A user who reads 0.3 to 2.5 s between replies: which pass its request lands in cannot be said, and a
    pass is not held to a first token's room for it; nor for a session whose habit is not yet known."""
    load = PlainLoad()
    ended = asking(load, "reader", [0.3, 2.5, 0.9, 1.6])
    assert all(not load.due(set(), ended + at, ended + at + 0.020) for at in (0.0, 0.3, 0.9, 1.3, 2.0))
    first = asking(load, "new", [0.014])
    assert not load.due(set(), first, first + 0.020)
