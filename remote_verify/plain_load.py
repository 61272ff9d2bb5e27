"""How many plain streams a server-only service would run under the same users: the ledger's counterfactual.

The fairness ledger (pass_ledger.py) holds every member of a shared pass to at least what it would make
as a plain stream. A plain stream's speed is set by how many streams share its passes. Under a closed
load (each user asks again the moment a reply ends) a server-only service runs the same streams as this
one: every user, always. Under an open load, users who read between replies, it runs more at once: its
replies last longer, so more of them overlap. Priced against this service's members alone, the plain
pass was cheaper than server-only's ever is, and the ledger held guesses to a speed the users never
had from plain streams (the emulated 70B target, users asking every 6 s, 256 users: with the ledger the
median user made 28.3 tokens/s over its replies, without it 46.4, server-only 15.8). Counted as below
(a window of five replies), the median user made 39.4 tokens/s over its replies and the slowest 26.2,
where the ledger priced by the members alone held them to 25.0 and 20.6 (docs/results.md).

So each session's habit is kept over its last few replies: their tokens (L), the seconds from one
reply's last pass to the next one's first (the gap), and from one reply's first pass to the next one's
(the cycle). A plain stream of c seconds a token keeps that user in a reply L c / (L c + Z) of the time
under server-only, where Z is the gap server-only would see; here it is in one R / (R + gap) of the time,
R its replies' seconds here (the cycle less the gap). Server-only's streams are this pass's members and
the sum over the users of the difference, at c = c(their number): the fixed point, found by iterating up
from the members (the sum grows with c, and c with the streams). Never fewer than the members now. The
difference, not the sum itself, because what keeps a user out of a pass while it is in a reply (a
prompt fed in pieces, a round trip in the middle of a reply) keeps it out under server-only too: under a
closed load the difference is none, and the plain pass is the members', as it always was.

Z depends on what sets a user's next request, and a session's own replies show which:
- a user who reads for a while after each reply (or a program that asks the moment one ends: a closed
  loop, whose gap is a round trip) keeps its gap whatever the replies' speed: Z is its gap;
- a user who asks on a schedule (every few seconds, whatever the replies took) keeps its cycle, and a
  longer reply under server-only eats into the gap: Z is the cycle less L c (none, where the reply
  takes the whole cycle).
A session whose cycles are steadier than its gaps (their spread under STEADIER times the gaps', over at
least SCHEDULE_REPLIES replies) is taken to ask on a schedule; any other, by its gap. Taking a reader's
gap is exact; taking a scheduled user's gap would count too few streams (its gap here is longer than
under server-only) and hold guesses to a speed no plain stream has. A user whose replies take longer
than its schedule asks the moment each ends: it is a closed loop, counted as one.

The same habits say what a reply that ends a pass sooner gives the others (`freed`, the ledger's credit for
a kept guess: pass_ledger.py): a user on a schedule is out of the passes a pass longer; one who asks a gap
after each reply asks sooner too, and spends less of its time in replies only by its gap's share.

The same habits say when a request is due (`due`): a session that asks a steady while after each reply ends
(its request's arrival, from its last pass's end) is expected that while after its last reply's end. A program
that asks the moment a reply ends lands its request a round trip into the pass after that reply's last pass, and
its first token waits out the rest of that pass: the queue holds such a pass to a first token's room
(remote_verify/scheduler.py). A reader's while spreads over seconds; no pass is held for it.

A session seen for its first reply only counts where it is a member now; one quiet for longer than its
usual gap counts that much more gap, and is forgotten after FORGET_CYCLES of its own cycles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable

REPLY_MEMORY = 0.75  # weight of the past per reply: a session's habit is its last few replies
FORGET_CYCLES = 10.0  # a session quiet this many of its own cycles is gone
ITERATIONS = 8  # steps of the fixed point (each moves it by the curve's slope: a few suffice)
SCHEDULE_REPLIES = 2  # gaps seen before a session may be taken to ask on a schedule (two: from its third reply)
STEADIER = 0.5  # ... where its cycles' spread is under this times its gaps'
STEADY_GAP = 0.01  # ... and its gaps spread by more than this part of a cycle (a closed loop's do not)
DUE_SPREADS = 2.0  # a request is expected within this many deviations of its session's usual while (`due`)


@dataclass
class Spread:
    """A decayed mean and spread of a session's measurements, one a reply."""

    mean: float = 0.0
    square: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        if not self.count:
            self.mean, self.square = value, value * value
        else:
            self.mean = REPLY_MEMORY * self.mean + (1 - REPLY_MEMORY) * value
            self.square = REPLY_MEMORY * self.square + (1 - REPLY_MEMORY) * value * value
        self.count += 1

    @property
    def deviation(self) -> float:
        return math.sqrt(max(0.0, self.square - self.mean * self.mean))


@dataclass
class Habit:
    """One session's replies: their length, the gaps before them and their cycles."""

    tokens: Spread = field(default_factory=Spread)  # a reply's tokens
    gap: Spread = field(default_factory=Spread)  # seconds from a reply's last pass to the next one's first
    cycle: Spread = field(default_factory=Spread)  # seconds from a reply's first pass to the next one's
    ask: Spread = field(default_factory=Spread)  # seconds from a reply's last pass to the next request's arrival
    current: float = 0.0  # tokens made in the reply under way
    decoding: bool = False  # its last pass made a reply's token (not a prompt's piece or first token)
    last_start: float | None = None  # when the reply under way began (time.perf_counter)
    last_end: float | None = None  # when its last pass ended

    @property
    def scheduled(self) -> bool:
        """Whether its next request keeps to a cycle rather than following its last reply's end."""
        return (self.gap.count >= SCHEDULE_REPLIES and self.cycle.deviation < STEADIER * self.gap.deviation
                and self.gap.deviation > STEADY_GAP * self.cycle.mean)

    @property
    def reply_s(self) -> float:
        """A reply's seconds here, from its first pass to its last (its cycle less its gap)."""
        return max(0.0, self.cycle.mean - self.gap.mean)

    def server_only_gap(self, pass_s: float) -> float:
        """The gap it would leave between plain streams' replies of `pass_s` seconds a token."""
        if self.scheduled:
            return max(0.0, self.cycle.mean - self.tokens.mean * pass_s)
        return self.gap.mean


class PlainLoad:
    """Each session's reply habit, and the plain streams server-only would run (device thread only)."""

    def __init__(self) -> None:
        self._habits: dict[Hashable, Habit] = {}

    def member(self, session: Hashable, starting: bool, made: float, began: float, ended: float,
               came: float | None = None) -> None:
        """`session` was in a pass from `began` to `ended` and made `made` tokens in it; `starting`: the
        pass fed its prompt (or a piece of it) before the reply's first token; `came`: when the request this
        pass serves reached the queue (None: not known)."""
        habit = self._habits.setdefault(session, Habit())
        if starting and (habit.decoding or habit.last_start is None):  # a reply begins
            if habit.decoding and habit.last_end is not None and habit.last_start is not None:
                habit.tokens.add(habit.current)
                habit.gap.add(max(0.0, began - habit.last_end))
                habit.cycle.add(max(0.0, began - habit.last_start))
                if came is not None and came >= habit.last_end:
                    habit.ask.add(came - habit.last_end)
            habit.current = 0.0
            habit.last_start = began
        habit.decoding = not starting
        habit.current += max(0.0, made)
        habit.last_end = ended

    def forget(self, session: Hashable) -> None:
        self._habits.pop(session, None)

    def freed(self, session: Hashable) -> float:
        """The member-passes a reply of `session` leaves to others for each pass it ends sooner, over the
        users' time: a user on a schedule is out of the passes one pass longer (its next request keeps its
        time), 1; a user who asks a while after each reply ends (a reader, or a closed loop's round trip)
        asks sooner too, and is in fewer passes only by its gap's share of its cycle, G / (R + G); a user
        whose habit is not yet known, none."""
        habit = self._habits.get(session)
        if habit is None or not habit.gap.count:
            return 0.0
        if habit.scheduled:
            return 1.0
        cycle = habit.reply_s + habit.gap.mean
        return habit.gap.mean / cycle if cycle > 0 else 0.0

    def due(self, busy: set[Hashable], start: float, end: float) -> bool:
        """Whether a new reply's request is expected to reach the queue from `start` to `end` (a pass about to
        run): that of a session between replies (not in `busy`) that asks a steady while after each reply
        ends (a program that asks the moment one ends, behind its round trip), the while's spread within the
        pass. A reader's while spreads over seconds: which pass its request lands in is anybody's guess."""
        for session, habit in self._habits.items():
            if (session in busy or not habit.decoding or habit.last_end is None or not habit.ask.count
                    or habit.scheduled):
                continue
            spread = DUE_SPREADS * habit.ask.deviation
            if spread > end - start:
                continue
            expected = habit.last_end + habit.ask.mean
            if start - spread <= expected <= end + spread:
                return True
        return False

    def streams(self, members: set[Hashable], pass_s: Callable[[int], float | None], now: float) -> float:
        """Server-only's plain streams at once under the users seen, at least len(members); `pass_s(n)`: the
        seconds of a plain pass of n streams (a token each)."""
        known: list[tuple[Habit, float]] = []  # sessions with a habit, and how long each has been quiet
        for session, habit in list(self._habits.items()):
            if not habit.gap.count:
                continue
            quiet = 0.0 if session in members or habit.last_end is None else max(0.0, now - habit.last_end)
            if quiet > FORGET_CYCLES * max(habit.cycle.mean, habit.gap.mean):
                del self._habits[session]
                continue
            known.append((habit, quiet))
        streams = float(len(members))
        for _ in range(ITERATIONS):
            seconds = pass_s(round(streams))
            if not seconds:
                break
            more = 0.0  # streams server-only would have in a reply at once, beyond those in one here
            for habit, quiet in known:
                overdue = max(0.0, quiet - habit.gap.mean)  # asking later than its habit (or gone)
                reply_s = habit.tokens.mean * seconds
                more += _busy(reply_s, habit.server_only_gap(seconds) + overdue) \
                    - _busy(habit.reply_s, habit.gap.mean + overdue)
            following = len(members) + max(0.0, more)
            if abs(following - streams) < 0.5:
                streams = following
                break
            streams = following
        return streams


def _busy(reply_s: float, gap_s: float) -> float:
    """The part of the time a user is in a reply: its reply's seconds over its cycle's."""
    return reply_s / (reply_s + gap_s) if reply_s + gap_s > 0 else 0.0
