"""When the drafter works during a stream, and how far ahead: from one objective and measured costs.

The objective is the user's rate: tokens committed per second of the stream. The stream
alone (no drafting) sets the floor: the service makes a token a pass and never waits for
the drafter, so drafting can only be worth its cost where it raises that rate.

What drafting can buy is bounded by two measured costs, with a a the acceptance of a guess
(the chance it is right when the ones before it were):
- the service's: a pass that verifies b guesses costs c(1 + b) (its measured cost curve,
  sent in the Welcome) and commits 1 + a + a^2 + ... + a^b tokens on average, against one
  token for c(1) without guesses;
- the drafter's: it makes a guess in g seconds, so a pass of c(1 + b) seconds can only
  find about c(1 + b) / g new guesses waiting.
and, on one machine, a third: the drafter takes cores the service's passes need. Each frame
says how long its pass took; divided by what the curve gives a pass of its size, that is the
service's slowdown, measured apart while the drafter works and while it rests, and their
ratio (`interference`, 1 where the service runs elsewhere) prices every drafting pass. Until
both are measured, a drafter on the service's machine is priced by the cores it takes: a
drafter working d of the n physical cores leaves the service's passes n - d of them, so they
take n / (n - d) as long (two cores, one drafting thread: 2; measured here with the default
pair, 2.4). Without that first guess, a fresh state on a small CPU machine spent its first
reply on a probe that could only lose (0.76x the stream's rate).
`possible_gain` is the best rate those allow over the stream's own, and where it is below 1
(a CPU target whose pass costs grow with every token, a drafter slower than a target step)
the drafter never starts. Where a remote service's curve makes it large (CLEAR_GAIN: a GPU,
where a pass of 16 tokens costs about one), drafting cannot lose: the drafter takes nothing
from the service and a guess costs its pass next to nothing, so it drafts from the start. In
between, the model has left out what only a measurement shows: a drafter on the service's
own machine takes the cores its passes need, and a far service passes the positions a chain
guessed before the chain arrives. So the rate itself decides: measured per frame while
drafting and while not, it keeps the drafter working while drafting is the faster of the
two, and rests it otherwise; a rest lasts `rest_tokens`, which doubles after each probe that
lost (a drafter that keeps losing costs less and less) and falls back after one that won.
The acceptance is kept current by the guesses themselves.

How far ahead: a guess helps if it reaches the service before the stream passes its position
and is right, so the chain runs ahead of what has been received by the tokens the stream
makes while a guess travels (`lead`), plus as many as are likely to be right (`span`).

Chain or tree (`width`), where the service verifies trees (its Welcome) and the drafter can decode
branches together: the same gain, asked for a tree of w branches (w = 1: a chain). A level of the
tree costs the drafter g x beta(leaves), its measured cost of decoding that many sequences one step
against one (`batch_cost`), for as many leaves as a level wanted to grow (measured: where the
drafter is sure a wide tree grows one leaf, a chain's level; `level_cost`), at most w; and the pass
c(1 + w x levels). A level is kept when the first choice is right (a) or, where it is wrong, one
of the alternatives is (h(w), measured as the share of the first choice's misses an alternative
caught, and carried to other widths as H (1 - 1/w): one alternative among two catches half of what
many would); the guesses go on below it only where the tree had grown that alternative (measured:
`carried_share`). A tree is drafted only where it beats the chain by TREE_MARGIN, and then the
widest that does, by the model of the stream (`gain(..., stream=True)`), which counts two things one
pass does not show: when the guesses end within a pass (a miss, an alternative left a leaf) the
service runs alone until the client's next guesses arrive, a round trip later (`blind_passes`),
which a tree saves wherever it grew the token the stream took; and a pass keeps at most the levels
the drafter made during one, the stream's own token included (where the drafter is sure, chains and
trees alike commit what it drafts: 6 to 7 tokens in a pass of the emulated 70B, where the drafter
makes 7.2 levels). Weighing one pass alone, the model drafted chains wherever the drafter was sure
enough to reach deeper with them (the emulated 70B, one user: the default mode 1.24x chains at 14 ms
where trees of 8 throughout made 1.28x); counting the round trip alone, it drafted trees on Apple's
drafter, whose levels of eight branches cost 3.6 steps there, where trees of 8 made 0.87x chains. A
drafter whose branches cost a step each (beta(w) = w: Apple Metal, a CPU) finds a level w times
slower, and drafts chains wherever the drafter, not the service, holds the stream back; a GPU
drafter (beta(8) = 1.6) widens. Until the drafter's time for a guess is measured, chains (the model
would take drafting for free, and every tree for a win).

The shape is the model's, not a race of measured rates: a stream's rate follows its text (on the
emulated 70B one user's prompts run at 1.7 to 6 tokens a pass), so chains measured on one stretch
and trees on the next compared the texts, not the shapes. Drafting chains for 24 tokens of every
512 to check that trees still won, and switching on those readings, made the default mode 1.12x
chains where trees throughout made 1.24x (the same replies, one run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from local_draft.decayed_mean import DecayedMean
from wire.cost_curve import curve_points, interpolate
from wire.protocol import PassCost

MEMORY = 0.85  # weight of the past per frame: a rate follows a change in the text within ~7 frames
STEADY_MEMORY = 0.98  # ... per guess, for a tree's width: about fifty guesses
PRIOR_ACCEPTANCE = 0.7
PRIOR_WEIGHT = 2.0
MIN_FRAMES = 4  # frames measured before a rate is trusted against the other (and rested before a probe)
PROBE_TOKENS = 24  # a probe drafts for this many committed tokens before its rate is read
FIRST_REST_TOKENS = 32  # rest after a losing probe; doubles with every losing probe after it
MAX_REST_TOKENS = 2048
# A drafter the costs rule out (possible_gain below MARGIN: a CPU target, or one on the drafter's own
# cores) probes again only after this many tokens, in case the machine changed: about 170 replies
# of 96 tokens. On two cores a probe slows the reply it falls in to half (the drafter reads the
# context on the service's cores), so refreshing after every 2,048 tokens cost a few percent.
HOPELESS_REST_TOKENS = 16384
MARGIN = 1.02  # drafting must be this much faster to be kept (its measurements are noisier)
CLEAR_GAIN = 2.0  # a remote service whose costs allow this much drafts without measuring
LIKELY = 0.15  # guesses whose chance of being reached and right is below this are not made
MAX_SPAN = 32
MOST_CORES_TAKEN = 0.25  # a drafter with as many threads as cores still leaves the service a share
TREE_WIDTHS = (1, 2, 4, 8)  # branches a tree level may hold (1: a chain); the draft model measures these
TREE_MARGIN = 1.05  # a tree must promise this much more than a chain (its h(w) is carried from one width)
# Before any tree was tested: the share of the first choice's misses that alternatives catch, at
# many branches (H; two branches catch half of it). An estimate, replaced by the measured share.
PRIOR_ALTERNATE = 0.8
# Before any tree was tested: the share of those catches below which the tree went on. An estimate,
# replaced by the measured share.
PRIOR_CARRIED = 0.5
MAX_WANTED = 64  # leaves counted as wanted at one level, at most (a flat distribution wants many)


class Decayed(DecayedMean):
    """An exponentially forgetting mean at the stream controller's pace, with its weight."""

    memory = MEMORY


class Steady(DecayedMean):
    """The acceptance a tree's width is chosen by: a tree lives until the stream takes a token none of
    its children guessed, tens of tokens, so it is chosen by about the last fifty guesses. The last
    seven's (`Decayed`) read 0.995 after a run of right ones, and chose chains at every new reply:
    on the emulated 70B at 14 ms three of ten replies drafted chains throughout, 10% slower there than
    trees of 8."""

    memory = STEADY_MEMORY


@dataclass
class StreamController:
    curve: Sequence[PassCost] = ()  # the service's cost curve (from its Welcome)
    # None: the drafter works while it pays, as measured; N: always, at most N guesses past the
    # stream's expected position (the user asked for it: `--k N`); 0: never
    max_block: int | None = None
    colocated: bool = True  # the service computes on this machine's cores (a loopback address)
    drafter_share: float = 0.0  # colocated: the share of the machine's physical cores the drafter works on
    drafting: bool = False  # the decision in force
    trees: bool = False  # the service verifies trees and the drafter decodes branches together
    batch_cost: dict = field(default_factory=dict)  # width -> the drafter's cost of a level of it over one guess
    width: int = 1  # the tree's branches in force (1: a chain)
    pinned_width: int | None = None  # a width fixed from outside (benchmarks compare shapes); None: chosen
    rest_tokens: int = 0  # tokens to rest before the next probe (0: probe as soon as drafting may pay)

    def __post_init__(self) -> None:
        self._acceptance = Decayed(PRIOR_ACCEPTANCE * PRIOR_WEIGHT, PRIOR_WEIGHT)
        self._steady = Steady(PRIOR_ACCEPTANCE * PRIOR_WEIGHT, PRIOR_WEIGHT)  # the same, over longer
        self._guess_s = Decayed()  # the drafter's seconds per guess
        self._token_s = {True: Decayed(), False: Decayed()}  # seconds per committed token, drafting or not
        self._frames = {True: 0, False: 0}
        self._wire_s = Decayed()  # the round trip, less the service's time
        self._points_of: Sequence[PassCost] | None = None  # the curve self._points was read from
        self._points: list[tuple[int, float]] = []
        self._slowdown = {True: Decayed(), False: Decayed()}  # a pass's time over the curve's, drafting or not
        self._since_switch = 0  # tokens committed since the decision last changed
        self._alternate = Decayed(PRIOR_ALTERNATE * PRIOR_WEIGHT, PRIOR_WEIGHT)  # h(w) / (1 - 1/w)
        self._carried = Decayed(PRIOR_CARRIED * PRIOR_WEIGHT, PRIOR_WEIGHT)  # caught misses the tree went on below
        self._wanted = Decayed()  # leaves a tree's level would grow if its width allowed them all
        self._blind = Decayed()  # passes without a guess after a miss, as counted

    # ---- what is measured -------------------------------------------------------------

    @property
    def acceptance(self) -> float:
        return min(self._acceptance.value, 0.995)

    def observe_guesses(self, right: int, tested: int) -> None:
        """Guesses compared with committed tokens: `right` of `tested` (the last one wrong if right < tested)."""
        for i in range(tested):
            self._acceptance.add(1.0 if i < right else 0.0)
            self._steady.add(1.0 if i < right else 0.0)
            # what a tree's level would have wanted here: the drafter's right guesses are mostly those it
            # was sure of (one leaf), its misses where it was not (every branch: the default pair's drafter
            # is right at 0.99 where it gives 0.9 or more, at 0.60 below 0.8, where 92% of its misses are).
            # Without this, a level's price stayed what the last tree measured (prose: 30 leaves wanted) and
            # chains drafted on code never tried the tree that made 15% more there.
            self._wanted.add(1.0 if i < right else float(TREE_WIDTHS[-1]))

    def observe_tree_levels(self, first_right: int, alternate_right: int, tested: int, width: int,
                            carried: int = 0) -> None:
        """Levels of a tree of `width` branches compared with committed tokens: at `first_right` of
        `tested` the first choice was right, at `alternate_right` an alternative was instead, `carried`
        of those with guesses below it at the service."""
        for i in range(tested):  # a level is a test of its first choice, whatever came before it
            self._acceptance.add(1.0 if i < first_right else 0.0)
            self._steady.add(1.0 if i < first_right else 0.0)
        for i in range(tested - first_right):  # each miss of the first choice: caught by an alternative or not
            self._alternate.add((1.0 if i < alternate_right else 0.0) / (1 - 1 / max(width, 2)))
        for i in range(alternate_right):
            self._carried.add(1.0 if i < carried else 0.0)

    def observe_level(self, wanted: int) -> None:
        """A tree's level was grown where `wanted` leaves were likely enough to grow (before the width
        capped them): a wide tree's level decodes only that many, one where the drafter is sure."""
        self._wanted.add(float(min(max(wanted, 1), MAX_WANTED)))

    def level_cost(self, width: int) -> float:
        """The drafter's time for a level of a tree of `width`, over one guess's: its batch cost of as
        many leaves as a level wanted (measured; `width` until a tree was grown), at most `width`."""
        return self._batch(self._leaves(width)) if width > 1 else 1.0

    def reread_cost(self, width: int) -> float:
        """What a tree's first level after a frame costs the drafter beyond a level, over one guess's:
        the newest committed token goes in that level's batch (the draft model re-roots its branches
        below the committed tokens, local_draft/draft_model.py `_reroot`), one sequence more: a tenth
        of a step on a laptop GPU (8 branches for 1.6), about a step where each branch costs one (a
        CPU). A chain that guessed the committed tokens has read them."""
        if width <= 1:
            return 0.0
        leaves = self._leaves(width)
        return max(0.0, self._batch(leaves + 1) - self._batch(leaves))

    def _leaves(self, width: int) -> float:
        """The leaves a level of a tree of `width` grows: as many as a level wanted, at most `width`."""
        wanted = self._wanted.value
        return float(width) if wanted is None else min(float(width), wanted)

    def _batch(self, leaves: float) -> float:
        """The drafter's cost of decoding `leaves` sequences a step together, over one (measured)."""
        points = sorted([(1, 1.0)] + [(w, x) for w, x in self.batch_cost.items() if w > 1])
        return max(1.0, interpolate(points, leaves)) if len(points) > 1 else max(1.0, leaves)

    @property
    def steady_acceptance(self) -> float:
        """The acceptance over about the last fifty guesses: what a tree's width is chosen by (`Steady`)."""
        return min(self._steady.value, 0.995)

    @property
    def carried_share(self) -> float:
        """The share of a tree's caught misses below which it went on (the alternative had guesses
        below it at the service): one left a leaf kept a token, and then ended the guesses as a miss."""
        return min(1.0, self._carried.value)

    def alternate_share(self, width: int) -> float:
        """h(width): the share of the first choice's misses that one of `width` branches catches."""
        return min(1.0, self._alternate.value) * (1 - 1 / width) if width > 1 else 0.0

    def observe_guess_time(self, seconds: float) -> None:
        self._guess_s.add(seconds)

    def observe_wire(self, seconds: float) -> None:
        self._wire_s.add(max(0.0, seconds))

    def observe_frame(self, tokens: int, interval_s: float, drafting: bool, forward_s: float = 0.0,
                      pass_tokens: int = 0) -> None:
        """A frame of `tokens` committed tokens came `interval_s` after the previous one, while the
        drafter was (or was not) working; its pass of `pass_tokens` tokens took `forward_s`."""
        if tokens <= 0 or interval_s <= 0:
            return
        expected = self.seconds(pass_tokens) if pass_tokens > 0 and forward_s > 0 else None
        if expected:
            self._slowdown[drafting].add(forward_s / expected)
        self._token_s[drafting].add(interval_s / tokens, tokens)
        self._frames[drafting] += 1
        self._since_switch += tokens
        self._decide()

    def rate(self, drafting: bool) -> float | None:
        """Measured tokens per second with the drafter working (or not); None until measured."""
        per_token = self._token_s[drafting].value
        if per_token is None or self._frames[drafting] < MIN_FRAMES:
            return None
        return 1.0 / per_token

    # ---- the model ------------------------------------------------------------------------

    def seconds(self, tokens: int) -> float | None:
        """The service's c(tokens), from its Welcome (None if it did not state it)."""
        if self._points_of is not self.curve:  # read once per curve: the gain asks for dozens of sizes a frame
            self._points_of, self._points = self.curve, curve_points(self.curve)
        return interpolate(self._points, tokens)

    @property
    def interference(self) -> float:
        """How much slower the service's passes run while the drafter works: as measured, else as
        the cores the drafter takes from a service on its machine imply (1: none, or no slower)."""
        drafting, resting = self._slowdown[True].value, self._slowdown[False].value
        if drafting and resting:
            return max(1.0, drafting / resting)
        if not self.colocated:
            return 1.0
        return 1.0 / max(1.0 - self.drafter_share, MOST_CORES_TAKEN)

    def possible_gain(self, acceptance: float | None = None) -> float:
        """The best rate drafting allows over the stream's own, from the costs (see above), with a
        chain or the best tree; infinite when they are not known, so that a first probe measures them."""
        return max(self.gain(width, acceptance) for width in self.widths())

    def widths(self) -> list[int]:
        """The tree widths open now: 1 (a chain), and those the drafter measured where trees are verified."""
        return [1] + ([w for w in TREE_WIDTHS if w > 1 and w in self.batch_cost] if self.trees else [])

    def gain(self, width: int = 1, acceptance: float | None = None, stream: bool = False) -> float:
        """The best rate drafting a tree of `width` branches (1: a chain) allows over the stream's own.

        With `stream`, counting what a stream pays beyond one pass: the passes the service runs alone
        after the guesses end (`blind_passes`), and a drafter that cannot keep ahead of the stream (a
        pass keeps at most the levels drafted during one: the stream's own token takes a drafted level
        too, and where a level costs a pass a tree's guesses arrive after the stream has passed them)."""
        a = self.acceptance if acceptance is None else acceptance
        step = self.seconds(1)
        if step is None:
            return math.inf
        guess_s = self._guess_s.value
        level_s = guess_s * self.level_cost(width) if guess_s else None  # the drafter's time a level
        caught = (1 - a) * self.alternate_share(width)  # a miss of the first choice an alternative catches
        kept_at = a + caught  # a level reached is kept: its first choice or an alternative is the target's
        survive = a + caught * self.carried_share  # ... and the guesses go on below it
        blind = self.blind_passes(step) if stream else 0.0
        # a level's nodes in the pass: with `stream`, as many as the level grows leaves (where the drafter
        # is sure, one: a tree of 8 priced at 8 nodes a level, a pass of 65 costing 1.27 one, drafted
        # chains on code where trees of 8 made 10% more), else the width
        nodes = (self._leaves(width) if width > 1 else 1.0) if stream else float(width)
        reread_s = guess_s * self.reread_cost(width) if guess_s else 0.0  # what a frame costs a tree's drafter
        best, interference = 1.0, self.interference
        for b in range(1, self.longest_block() + 1):
            cost = self.seconds(1 + b * nodes) * interference
            if cost <= 0:  # a curve that says a pass costs nothing says nothing a gain can be read from
                return math.inf
            # levels the drafter can have ready in a pass, a tree's less what a frame costs it
            found = b if not level_s else min(b, max(0.0, cost - reread_s) / level_s)
            whole = int(found)  # the whole levels drafted in a pass, and a part of one more
            reached = survive ** whole
            # sum(survive ** i for i < whole), in closed form: this runs for every block size and width at
            # each reply's start and each miss, on the client's loop, before the frame it has
            levels = whole if survive == 1.0 else (1.0 - reached) / (1.0 - survive)
            kept = 1.0 + kept_at * levels + (found % 1) * kept_at * reached
            if stream and level_s:
                kept = min(kept, max(1.0, found))
            dies = 1.0 - survive ** found  # the guesses end within the pass (a miss, a leaf): blind passes follow
            best = max(best, (kept + dies * blind) * step / (cost + dies * blind * step))
        return best

    def blind_passes(self, step: float) -> float:
        """Passes of one token the service runs after a miss before the next guesses reach it: as
        counted after the misses so far (`observe_blind`), else from the round trip: it goes on at once,
        and the client hears of the miss, drafts a guess and sends it a round trip later (half a pass
        more on average: guesses that arrive as a pass begins wait for the next). A trace of the
        emulated 70B at 14 ms counted 2 where the round trip says 1.4: the client's frame handling and
        the link add to it, and with the count the default mode made 1.31x chains there, not 1.28x."""
        counted = self._blind.value
        if counted is not None:
            return counted
        return ((self._wire_s.value or 0.0) + (self._guess_s.value or 0.0)) / step + 0.5

    def observe_blind(self, passes: int) -> None:
        """After a miss, `passes` passes verified no guess before one did."""
        self._blind.add(float(passes))

    def choose_width(self) -> int:
        """The tree's branches for the next guesses (1: a chain): the model's (`modelled_width`)."""
        if self.pinned_width is not None:  # a benchmark compares shapes
            self.width = self.pinned_width if self.trees else 1
        else:
            self.width = self.modelled_width()
        return self.width

    def modelled_width(self) -> int:
        """The widest tree that beats the chain by TREE_MARGIN in the model (1: none does, or the
        drafter's guess time is not measured yet)."""
        if self._guess_s.value is None:
            return 1
        steady = self.steady_acceptance
        chain = self.gain(1, steady, stream=True)
        return max((w for w in self.widths() if w > 1 and self.gain(w, steady, stream=True) >= chain * TREE_MARGIN),
                   default=1)

    def longest_block(self) -> int:
        return MAX_SPAN if self.max_block is None else max(1, min(self.max_block, MAX_SPAN))

    # ---- the decisions ----------------------------------------------------------------------

    def horizon(self, rate: float | None) -> int:
        """How many guesses ahead of the received text the chain may run (0: none)."""
        if not self.drafting:
            return 0
        survive = min(0.995, self.acceptance + (1 - self.acceptance) * self.alternate_share(self.width))
        likely = max(2, math.ceil(math.log(LIKELY) / math.log(survive))) if survive > 0 else 2
        span = min(self.longest_block(), likely)
        lead = self.passed(rate) + 1  # positions the stream passes before a guess made now arrives
        return lead + span if self.max_block is None else min(lead + span, lead + self.max_block)

    def passed(self, rate: float | None) -> int:
        """Positions past the received text the stream will have committed when a guess made now
        reaches the service: the received text is half a round trip old, and the guess travels the
        other half. (Half a round trip alone, as this was counted, left a chain at 100 ms ending
        about five tokens short of where it was meant to.)"""
        return math.ceil((rate or 0.0) * (self._wire_s.value or 0.0))

    def new_reply(self) -> None:
        """A reply starts: the decision in force carries over, its measurements too."""
        self._decide()
        self.choose_width()

    def _decide(self) -> None:
        if self.max_block is not None:
            self._switch(self.max_block > 0)  # the user's setting, not a measurement
            return
        hopeless = self.possible_gain(max(self.acceptance, 0.9)) < MARGIN
        if hopeless and not self.drafting and self._since_switch < HOPELESS_REST_TOKENS:
            return  # cannot pay even at a good acceptance: rest (after HOPELESS_REST_TOKENS, one probe all
            # the same, in case what was measured has changed)
        if not hopeless and not self.colocated and self.possible_gain() >= CLEAR_GAIN:
            self._switch(True)  # cannot lose: nothing to measure
            return
        drafting_rate, resting_rate = self.rate(True), self.rate(False)
        if self.drafting:
            if resting_rate is None and self._since_switch >= 4 * PROBE_TOKENS:
                self._switch(False)  # drafting since the start (as the last run ended): measure the rate to beat
                return
            if self._since_switch < PROBE_TOKENS or drafting_rate is None or resting_rate is None:
                return  # a probe runs its course
            if drafting_rate < resting_rate * MARGIN:
                self.rest_tokens = min(max(self.rest_tokens * 2, FIRST_REST_TOKENS), MAX_REST_TOKENS)
                self._switch(False)
            else:
                self.rest_tokens = 0  # it pays: the next rest (if the text changes) is short
        elif resting_rate is not None and self._since_switch >= min(self.rest_tokens, MAX_REST_TOKENS):
            self._switch(True)  # rested long enough, and the rate to beat is measured: probe

    def _switch(self, drafting: bool) -> None:
        if drafting != self.drafting:
            self.drafting = drafting
            self._since_switch = 0
            self._token_s[drafting] = Decayed()  # a fresh measurement for the new regime
            self._frames[drafting] = 0

    # ---- kept between runs ------------------------------------------------------------------

    def state(self) -> dict:
        return {"acceptance": [self._acceptance.total, self._acceptance.weight],
                "guess_s": [self._guess_s.total, self._guess_s.weight],
                "wire_s": [self._wire_s.total, self._wire_s.weight],
                "slowdown_drafting": [self._slowdown[True].total, self._slowdown[True].weight],
                "slowdown_resting": [self._slowdown[False].total, self._slowdown[False].weight],
                "rest_tokens": self.rest_tokens, "drafting": self.drafting, "since_switch": self._since_switch}

    def restore(self, state: dict) -> None:
        """Start from a `state()` of an earlier run; ValueError (nothing changed) if it is malformed."""
        try:
            state = {"slowdown_drafting": [0.0, 0.0], "slowdown_resting": [0.0, 0.0], **state}
            pairs = [[float(x) for x in state[name]] for name in ("acceptance", "guess_s", "wire_s",
                                                                   "slowdown_drafting", "slowdown_resting")]
            rest_tokens = int(state["rest_tokens"])
            since_switch = int(state.get("since_switch", 0))
            drafting = bool(state["drafting"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"not a stream controller state: {exc}") from None
        if any(len(pair) != 2 or not all(math.isfinite(x) and x >= 0 for x in pair) for pair in pairs):
            raise ValueError("not a stream controller state: wrong shapes or values")
        for decayed, (total, weight) in zip((self._acceptance, self._guess_s, self._wire_s, self._slowdown[True],
                                             self._slowdown[False]), pairs):
            decayed.total, decayed.weight = total, weight
        if self._acceptance.value is None:
            self._acceptance = Decayed(PRIOR_ACCEPTANCE * PRIOR_WEIGHT, PRIOR_WEIGHT)
        self.rest_tokens = max(0, min(rest_tokens, MAX_REST_TOKENS))
        self._since_switch = max(0, min(since_switch, HOPELESS_REST_TOKENS))
        self.drafting = drafting
