"""Adaptive draft length: pick k each round to maximise the expected tokens per second.

A round that drafts k tokens commits, on average (alpha: the chance that a draft token is
accepted once the ones before it were),
    tokens(k) = 1 + alpha + alpha^2 + ... + alpha^k
and costs
    time(k)   = draft(k) + wire + verify(k)
    draft(k)  = draft_token_s * k                    (nothing at k = 0)
    verify(k) = verify_base_s + verify_token_s * (k + 1)
When drafting ahead (pipelining), the next block is drafted while the verdict is in flight
and kept when the whole block and the guessed bonus token are right (chance ~ alpha^(k+1)),
so that much of draft(k) hides behind wire + verify(k).

Every quantity is measured as rounds go by, with exponential forgetting so that the
controller follows a reply from code into prose. A one-token step (k = 0) is timed apart
from the line fitted to blocks: a service may run the two differently (on a CPU beside the
drafter, blocks on more threads: wire/threads.py), and that step is what drafting must beat.

A new reply (`new_reply`) keeps the costs but not the confidence in the acceptance: it
starts half way between the last reply's and the prior, worth PRIOR_WEIGHT tested tokens,
so that a reply of prose after one of code learns its own acceptance in a round or two
instead of a dozen (and an early run of easy tokens does not send it to long blocks); if drafting does not
pay at that mean, the reply's first choice is a probe all the same (code after prose
would otherwise stay at k = 0 until a probe comes, 16 rounds or more). And a block grows
at most to twice what the last drafting round got right, plus one (START_K at a reply's
start): a wrong 16-token block costs 13 more target steps on a CPU, a short one one or two.

k = 0 (no drafting: the service makes every token) is chosen when speculation does not pay; from there a small probe now and then
keeps the acceptance estimate alive when an optimistic acceptance would make drafting pay,
and a rarer one refreshes the measured costs in any case. The speculation loop stays exact whatever k this picks.
"""

from __future__ import annotations

from dataclasses import dataclass

from local_draft.decayed_mean import DecayedMean

MEMORY = 0.8  # weight of the past per round: ~5 rounds, so a switch from code to prose shows fast
PRIOR_ALPHA = 0.7  # before any round: a same-family pair on ordinary text
PRIOR_WEIGHT = 2.0  # worth two tested tokens
START_K = 4  # until draft and verify costs have been measured; the first block of a reply
PROBE_EVERY = 16  # rounds at k = 0 between two probes, if drafting might pay
REFRESH_EVERY = 64  # rounds at k = 0 between two probes in any case: the costs may have changed
PROBE_K = 2  # a probe is small: at worst it costs about one target step
OPTIMISM = 0.2  # a probe is worth it if alpha + OPTIMISM would make drafting pay
EXPLORE_EVERY = 8  # every 8th drafting round tries another k: k + 2, then 0, in turn
# so verify is seen at three sizes, one of them a plain decode step: a line fitted to long
# blocks alone can misjudge a decode step (on a CPU, by more than a third) and never learn
# that drafting stopped paying
MAX_FIT_TOKENS = 48  # verify timings of blocks up to this size fit the cost line (not prompts)


class Decayed(DecayedMean):
    """An exponentially forgetting mean, at adaptive k's pace."""

    memory = MEMORY


class _CostLine:
    """verify(n) = base + per_token * n, fitted to recent rounds (n: tokens fed to the target)."""

    def __init__(self) -> None:
        self.sums = [0.0] * 5  # decayed w, w*n, w*n^2, w*t, w*n*t

    def add(self, n: int, seconds: float) -> None:
        self.sums = [s * MEMORY for s in self.sums]
        for i, term in enumerate((1.0, n, n * n, seconds, n * seconds)):
            self.sums[i] += term

    def predict(self, n: int) -> float | None:
        w, wn, wnn, wt, wnt = self.sums
        if w < 1e-9:
            return None
        spread = w * wnn - wn * wn
        if spread < 1e-6 * max(w * wnn, 1e-12):
            # One block size seen so far: assume the cost grows with the block, as on a CPU.
            # A flat guess made the longest block look free and sent the second round to
            # max_k; this one errs towards short blocks, whose rounds then show the slope.
            return wt / wn * n
        slope = max(0.0, (w * wnt - wn * wt) / spread)  # a longer block never costs less
        mean_n, mean_t = wn / w, wt / w
        return max(0.0, mean_t + slope * (n - mean_n))


@dataclass(frozen=True)
class RoundTiming:
    """What one verified round cost, as the speculation loop measured it."""

    k: int  # draft tokens sent
    accepted: int
    draft_s: float  # drafting on the critical path (drafting ahead excluded)
    draft_tokens: int  # tokens the drafter evaluated for that time
    fed_tokens: int  # tokens the target ran (history catch-up + draft)
    service_s: float  # the service's own time: queue, forward, acceptance
    wire_s: float  # the round trip minus the service's time
    source: str = "model"  # who drafted: "model" or "ngram" (whose acceptance is learned elsewhere)


class AdaptiveK:
    def __init__(self, max_k: int = 16, pipelined: bool = False):
        self.max_k = max_k
        self.pipelined = pipelined
        self._accepted = Decayed()
        self._accepted.add(PRIOR_ALPHA, PRIOR_WEIGHT)
        self._draft_token_s = Decayed()
        self._wire_s = Decayed()
        self._verify = _CostLine()  # blocks (2+ tokens fed)
        self._step_s = Decayed()  # one token fed: a plain decode step
        self._grow_cap: int | None = None  # the longest block the last drafting round earned; None: any
        self._probe_first = False  # a reply started: its first choice drafts, at least a probe
        self._rounds_at_zero = 0
        self._rounds_drafting = 0
        self.last_choice = START_K

    @property
    def measured(self) -> bool:
        """Whether drafting and verify costs have been seen (before that, k is START_K)."""
        return self._draft_token_s.value is not None and self.verify_measured

    @property
    def verify_measured(self) -> bool:
        """Whether a verify cost has been seen (enough to size a draft that costs nothing to make)."""
        return self._verify.predict(2) is not None or self._step_s.value is not None

    @property
    def alpha(self) -> float:
        return min(self._accepted.value or PRIOR_ALPHA, 0.995)

    def choose(self, remaining: int, limit: int | None = None) -> int:
        """k for the next round: at most `remaining` - 1 tokens (the service adds one) and `limit`
        (the service's longest draft block)."""
        cap = max(0, min(self.max_k, remaining - 1, self.max_k if limit is None else limit))
        if self._grow_cap is not None:
            cap = min(cap, self._grow_cap)
        if not self.measured:
            choice = min(START_K, cap)
        else:
            choice = self.best_k(self.alpha, cap)
            if choice == 0 and self._probe_first:
                choice = min(PROBE_K, cap)
            elif choice == 0:
                self._rounds_at_zero += 1
                hopeful = (self._rounds_at_zero % PROBE_EVERY == 0
                           and self.best_k(min(self.alpha + OPTIMISM, 0.995), cap) > 0)
                if cap > 0 and (hopeful or self._rounds_at_zero % REFRESH_EVERY == 0):
                    choice = min(PROBE_K, cap)
            else:
                self._rounds_at_zero = 0
                self._rounds_drafting += 1
                if self._rounds_drafting % (2 * EXPLORE_EVERY) == 0:
                    choice = 0
                elif self._rounds_drafting % EXPLORE_EVERY == 0:
                    choice = min(choice + 2, cap)
        self._probe_first = False
        self.last_choice = choice
        return choice

    def new_reply(self) -> None:
        """A reply starts: acceptance half way between the last reply's and the prior, at the weight
        of PRIOR_WEIGHT tested tokens, and blocks from START_K (a new text may draft unlike the last)."""
        self._accepted.total = (self.alpha + PRIOR_ALPHA) / 2 * PRIOR_WEIGHT
        self._accepted.weight = PRIOR_WEIGHT
        self._grow_cap = START_K
        self._probe_first = True

    def best_k(self, alpha: float, cap: int) -> int:
        rates = [self.expected_rate(k, alpha) for k in range(cap + 1)]
        return max(range(cap + 1), key=lambda k: rates[k])

    def expected_rate(self, k: int, alpha: float, draft_token_s: float | None = None) -> float:
        """Expected tokens per second of a round drafting k tokens (at the draft model's measured
        cost per token, or `draft_token_s`: 0 for the n-gram drafter)."""
        tokens = sum(alpha ** i for i in range(k + 1))
        per_token = self._draft_token_s.value if draft_token_s is None else draft_token_s
        draft = (per_token or 0.0) * k
        verify = self.verify_s(k + 1)
        wire = self._wire_s.value or 0.0
        hidden = 0.0
        if self.pipelined and k > 0:
            # the block drafted ahead is kept when all k and the guessed bonus are right
            hidden = alpha ** (k + 1) * min(draft, wire + verify)
        return tokens / max(draft - hidden + wire + verify, 1e-6)

    @property
    def wire_s(self) -> float | None:
        """The measured round trip less the service's time (None before any round)."""
        return self._wire_s.value

    def verify_s(self, fed: int) -> float:
        """The service's expected time for `fed` tokens: a one-token step as measured, if it was."""
        step = self._step_s.value
        if fed == 1 and step is not None:
            return step
        line = self._verify.predict(fed)
        if line is not None:
            return line
        return step * fed if step is not None else 0.0  # no block timed yet: as if token by token

    def state(self) -> dict:
        """What has been learned (acceptance, drafting, wire and verify costs), as plain JSON data."""
        return {"accepted": [self._accepted.total, self._accepted.weight],
                "draft_token_s": [self._draft_token_s.total, self._draft_token_s.weight],
                "wire_s": [self._wire_s.total, self._wire_s.weight],
                "step_s": [self._step_s.total, self._step_s.weight],
                "verify": list(self._verify.sums), "last_choice": self.last_choice}

    def restore(self, state: dict) -> None:
        """Start from a `state()` of an earlier run; ValueError (and nothing changed) if it is malformed."""
        try:
            state = {"step_s": [0.0, 0.0], **state}  # saved before one-token steps were timed apart
            pairs = [[float(x) for x in state[name]] for name in ("accepted", "draft_token_s", "wire_s", "step_s")]
            verify = [float(x) for x in state["verify"]]
            last_choice = int(state["last_choice"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: a 400-digit number
            raise ValueError(f"not an adaptive-k state: {type(exc).__name__}: {str(exc)[:200]}") from None
        numbers = [x for pair in pairs for x in pair] + verify
        if (any(len(pair) != 2 or pair[1] < 0 for pair in pairs) or len(verify) != 5
                or any(x != x or abs(x) == float("inf") for x in numbers)):
            raise ValueError("not an adaptive-k state: wrong shapes or values")
        for decayed, (total, weight) in zip((self._accepted, self._draft_token_s, self._wire_s, self._step_s), pairs):
            decayed.total, decayed.weight = total, weight
        self._verify.sums = verify
        self.last_choice = max(0, min(last_choice, self.max_k))

    def observe(self, timing: RoundTiming) -> None:
        if timing.k > 0 and timing.source == "model":  # the n-gram drafter's: local_draft/draft_source.py
            # tested positions: every accepted one, plus the first rejected one if any
            tested = timing.accepted + (1 if timing.accepted < timing.k else 0)
            self._accepted.add(timing.accepted / tested, tested)
            # all accepted: the block may double; else twice what it got right: after a miss at
            # the first token, 2 (a text that stopped drafting well costs little to find out)
            self._grow_cap = 2 * (timing.accepted + 1)
        if timing.draft_tokens > 0:
            self._draft_token_s.add(timing.draft_s / timing.draft_tokens)
        if timing.fed_tokens == 1:
            self._step_s.add(timing.service_s)
        elif timing.fed_tokens <= MAX_FIT_TOKENS:
            self._verify.add(timing.fed_tokens, timing.service_s)
        self._wire_s.add(timing.wire_s)
