"""The device's cost curve c(n): what a forward pass of n tokens costs, as measured here.

Measured at start (`calibrate`: passes of 1 to 16 tokens on a scratch cache, after the
model is loaded, the median of a few runs of each, a single run where a round of them takes
seconds) and kept current from every real pass afterwards (`observe`, by the pass's total
tokens, with exponential forgetting: a busy neighbour on a shared machine, or a warmer GPU,
shows within a few dozen passes). Between measured sizes the curve is interpolated, past the
largest it grows along its last slope, so any n has a cost.

A shared pass's cost depends on its members too, not only on its tokens: each member's
sequence adds its own work (sampling, attention over its own cache), so 64 tokens cost more as
the last tokens of 64 streams than as one stream's block. A curve keyed by tokens alone, kept
across loads, priced a pass of 64 streams by passes measured with 128 (the emulated 70B target:
a wave of 64 users after one of 128 verified 0.8 guesses a pass, against 1.8 on a fresh
service). So every pass is also recorded in a curve of its own for passes of about as many
members (`shared`: sizes a factor of about 1.4 apart), and the pricing of a shared pass reads
that one where it has been measured.

The curve is read smoothed (`points`): sizes past EXACT_SIZES are pooled in bins about 9% apart
(their weighted means), the pooled points made never to fall (a larger pass never costs less),
past the largest size the curve grows along a line fitted to the upper half of its sizes, and
below the smallest it falls along one fitted to the lower half (never below cost in proportion
to tokens).
A shared pass's size is its members' tokens plus their guesses, so its sizes are many and each
seen a few times: read raw, two neighbouring sizes' noise set the slope that priced the next
guess, and past the largest size seen a guess looked free wherever the last two happened to be
level (the emulated 70B target at 128 users, with no pass budget: passes of ten guesses a
member, 3,475 tokens/s against 4,814 at a budget of 1,024; one run each). And a band whose passes
all carry guesses never times a plain pass of its members: read flat below its smallest size, it
priced the plain pass as dear as the guessing ones, and every member's ledger (pass_ledger.py)
saw passes four times as long as plain ones cost it nothing (at 128 users with no budget, a
tenth of the users made 10 tokens/s where the median made 28).

Two readers: a stream's block choice (how many of a client's draft tokens a pass should
verify: remote_verify/stream_drafts.py), and the clients, who get the curve in their Welcome
(`PassCost` points) and decide from it whether their drafting can pay at all. On a GPU the
curve is flat for tens of tokens (a pass reads the weights once); on a CPU it rises with
every token, which is why the same controller drafts there so much less.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
import weakref
from typing import Sequence

from wire.cost_curve import interpolate
from wire.protocol import PassCost

log = logging.getLogger(__name__)

MEMORY = 0.9  # weight of the past per observation of a size: about ten passes
CALIBRATION_SIZES = (1, 2, 4, 8, 16)  # blocks of up to 16 tokens cover a stream's drafts
CALIBRATION_CONTEXT = 32  # tokens cached before the timed passes, as in a short prompt
CALIBRATION_RUNS = 3  # timed runs of each size after its first: their median is recorded
# ... fewer where the timed runs so far took longer than this: a large target on a CPU (a round of the
# sizes took 3.5 s for Qwen2.5-Coder-1.5B on one thread) would keep `serve` from listening for
# many seconds, and every real pass refines the curve afterwards anyway
CALIBRATION_BUDGET_S = 2.0
REPORTED_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the points a Welcome carries


EXACT_SIZES = 16  # sizes up to this are points of their own (a stream's blocks; the calibration's)
BINS_PER_OCTAVE = 8  # past them, sizes within about 9% of each other are pooled


def pooled_curve(measured: Sequence[tuple[int, float, float]]) -> tuple[list[tuple[float, float]], float, float]:
    """A smooth curve from measured (tokens, seconds, weight) sizes, sorted by tokens: the points
    (sizes past EXACT_SIZES pooled by BINS_PER_OCTAVE into their weighted means, then pooled with
    their neighbours wherever a larger size measured cheaper, so that the curve never falls), the
    slope before the first point (a weighted least-squares line through the points of at most twice
    its size) and the slope past the last (one through those of at least half its size); never
    falling; with a single point, cost in proportion to tokens."""
    bins: dict[int, list[float]] = {}
    for tokens, seconds, weight in measured:
        key = tokens if tokens <= EXACT_SIZES else \
            EXACT_SIZES + 1 + round(BINS_PER_OCTAVE * math.log2(tokens / EXACT_SIZES))
        pooled = bins.setdefault(key, [0.0, 0.0, 0.0])
        pooled[0] += tokens * weight
        pooled[1] += seconds * weight
        pooled[2] += weight
    blocks: list[list[float]] = []  # [tokens x weight, seconds x weight, weight], cost never falling
    for key in sorted(bins):
        blocks.append(list(bins[key]))
        while len(blocks) > 1 and blocks[-1][1] / blocks[-1][2] < blocks[-2][1] / blocks[-2][2]:
            last = blocks.pop()
            blocks[-1] = [a + b for a, b in zip(blocks[-1], last)]
    points = [(t / w, s / w) for t, s, w in blocks]
    weighted = list(zip(points, [w for _, _, w in blocks]))
    if len(points) < 2:
        slope = points[0][1] / points[0][0] if points else 0.0
        return points, slope, slope
    lower = [(p, w) for p, w in weighted if p[0] <= 2 * points[0][0]]
    upper = [(p, w) for p, w in weighted if p[0] >= points[-1][0] / 2]
    return points, _fitted_slope(lower if len(lower) > 1 else weighted[:2]), \
        _fitted_slope(upper if len(upper) > 1 else weighted[-2:])


def _fitted_slope(weighted: list[tuple[tuple[float, float], float]]) -> float:
    """The slope of the weighted least-squares line through ((tokens, seconds), weight) points, never below 0."""
    total = sum(w for _, w in weighted)
    mean_n = sum(p[0] * w for p, w in weighted) / total
    mean_s = sum(p[1] * w for p, w in weighted) / total
    spread = sum(w * (p[0] - mean_n) ** 2 for p, w in weighted)
    slope = sum(w * (p[0] - mean_n) * (p[1] - mean_s) for p, w in weighted) / spread if spread > 0 else 0.0
    return max(0.0, slope)


def members_band(members: int) -> int:
    """The band of passes with about `members` members: bands a factor of sqrt(2) apart."""
    return round(2 * math.log2(max(1, members)))


class PassCosts:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # observed on the device thread, read on the event loop too
        self._seconds: dict[int, tuple[float, float]] = {}  # tokens -> (decayed total, decayed weight)
        self._by_members: dict[int, PassCosts] = {}  # members_band -> the curve of passes in that band
        # (points, slope before them, slope past them): see `seconds`
        self._smoothed: tuple[list[tuple[float, float]], float, float] | None = None

    @property
    def known(self) -> bool:
        return bool(self._seconds)

    def observe(self, tokens: int, seconds: float, members: int = 1) -> None:
        """A pass of `tokens` tokens (every session's in it), of `members` sessions, took `seconds`."""
        if tokens < 1 or not seconds >= 0:
            return
        self._record(tokens, seconds)
        with self._lock:
            band = self._by_members.get(members_band(members))
            if band is None:
                band = self._by_members[members_band(members)] = PassCosts()
        band._record(tokens, seconds)

    def _record(self, tokens: int, seconds: float) -> None:
        with self._lock:
            total, weight = self._seconds.get(tokens, (0.0, 0.0))
            self._seconds[tokens] = (total * MEMORY + seconds, weight * MEMORY + 1.0)
            self._smoothed = None

    def shared(self, members: int) -> "PassCosts":
        """The curve of passes of about `members` members, once one has been timed; else this one."""
        with self._lock:
            band = self._by_members.get(members_band(members))
        return band if band is not None and band.known else self

    def seconds(self, tokens: int) -> float | None:
        """c(tokens): the expected seconds of a pass of that many tokens (None before any measurement)."""
        points, below, past = self._smooth()
        if not points:
            return None
        (first, first_s), (last, last_s) = points[0], points[-1]
        tokens = max(tokens, 1)  # no pass costs less than one of a token
        if tokens < first:  # a pass smaller than any timed: along the curve's first slope, and never less than
            # in proportion to its tokens (a pass's cost is a fixed part plus a part that grows with them)
            return max(first_s - below * (first - tokens), first_s * tokens / first)
        if tokens > last:
            return last_s + past * (tokens - last)
        return interpolate(points, tokens)

    def sizes(self) -> list[int]:
        """The pass sizes (tokens) timed so far."""
        with self._lock:
            return sorted(self._seconds)

    def points(self) -> list[tuple[float, float]]:
        """The curve's (tokens, seconds) points, smoothed (see the module's docstring), sorted."""
        return self._smooth()[0]

    def _smooth(self) -> tuple[list[tuple[float, float]], float, float]:
        with self._lock:
            if self._smoothed is None:
                self._smoothed = pooled_curve([(n, total / weight, weight) for n, (total, weight)
                                               in sorted(self._seconds.items())])
            return self._smoothed

    def curve(self, sizes: Sequence[int] = REPORTED_SIZES) -> list[PassCost]:
        """The curve at a few sizes, for a Welcome (empty before any measurement)."""
        if not self.known:
            return []
        return [PassCost(tokens=n, ms=round(self.seconds(n) * 1000, 4)) for n in sizes]

    def calibrate(self, backend) -> None:
        """Time passes of CALIBRATION_SIZES tokens after a short context: each size once unrecorded
        (the first run of a shape pays for allocations), then CALIBRATION_RUNS times, and the median
        recorded (a neighbour that took the cores for one run does not make the curve); once the timed
        runs have taken CALIBRATION_BUDGET_S, no more (at least one of each size). On the device thread,
        before sessions are taken."""
        cache = backend.new_cache()
        try:
            backend.forward(cache, [backend.bos_id] * CALIBRATION_CONTEXT, 1)
            runs: dict[int, list[float]] = {size: [] for size in CALIBRATION_SIZES}
            timed_s = 0.0
            for turn in range(1 + CALIBRATION_RUNS):
                if turn > 1 and timed_s > CALIBRATION_BUDGET_S:
                    break
                turn_started = time.perf_counter()
                for size in CALIBRATION_SIZES:
                    started = time.perf_counter()
                    backend.forward(cache, [backend.bos_id] * size, 1)
                    if turn:
                        runs[size].append(time.perf_counter() - started)
                    backend.truncate(cache, CALIBRATION_CONTEXT)
                if turn:
                    timed_s += time.perf_counter() - turn_started
            for size, seconds in runs.items():
                self.observe(size, statistics.median(seconds))
        finally:
            release = getattr(backend, "release", None)
            if release is not None:
                release(cache)
        log.info("pass costs: %s", ", ".join(f"{p.tokens} tokens {p.ms:.1f} ms" for p in self.curve(CALIBRATION_SIZES)))


# One curve per loaded backend in this process, measured once: services that share a backend
# object (several in one test process) share its measurements, and never calibrate it at once.
_CURVES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CALIBRATING = threading.Lock()


def costs_for(backend) -> PassCosts:
    """The cost curve of `backend`, calibrated on first use (on the caller's thread: the device's)."""
    with _CALIBRATING:
        costs = _CURVES.get(backend)
        if costs is None:
            costs = _CURVES[backend] = PassCosts()
            try:
                costs.calibrate(backend)
            except Exception as exc:  # no memory for a scratch cache, say: the real passes will measure it
                log.warning("could not time the pass costs at start (%s: %s): they are learned from the first "
                            "passes instead", type(exc).__name__, exc)
        return costs
