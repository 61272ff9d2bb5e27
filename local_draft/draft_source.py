"""Which drafter drafts a round: the n-gram copy of the context, or the draft model.

Three settings (the Speculator's `drafting`):
- "model": the draft model alone (what specwire did before n-gram drafting);
- "ngram": the n-gram drafter alone, no model at all (a thin client); a round with no
  usable match drafts nothing and the service makes the token;
- "mixed": per round, the n-gram draft when its match is long enough, else the model.

"Long enough" is learned, not set. The n-gram drafter's acceptance is measured for each
match length n (1..MAX_N), apart for rounds that follow a right copy (the previous round's
proposal matched everything it committed: a copy in progress, right about nine times in ten
on edited code) and the others, on every round, whoever drafted it: its proposal at the round's
start is scored against the tokens the round committed, which are the target's own (under
sampling, a target sample: the chance that it equals the proposed token is exactly the
point-mass draft's acceptance probability). So the estimates stay current while the model
drafts, and no round is spent probing. The rule:

    use the n-gram draft of match length n  iff  alpha_n >= alpha(model)
                                             and rate(ngram, alpha_n) >= rate(model)

where rate is adaptive k's expected tokens per second of a round (local_draft/adaptive_k.py:
tokens 1 + a + .. + a^k over draft + wire + verify(k)), the n-gram's at its best k with no
drafting cost and its own alpha_n, the model's at the k the controller chose with the
model's acceptance (measured on model rounds only). The first condition keeps a copy that
is less often right than the model from displacing it where the model's drafting is
hidden behind the round trip (drafting ahead): there a wrong copy costs the block drafted
ahead as well. The threshold is then the shortest match length whose acceptance wins; it moves with the text and with the costs (a far
service favours longer blocks, a slow drafter favours the copy). With a fixed k both
candidates draft k tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from local_draft.adaptive_k import START_K, AdaptiveK, Decayed
from local_draft.ngram_draft import MAX_N, NGramDrafter, NGramProposal

DRAFTINGS = ("model", "ngram", "mixed")
# Before any measurement a short match is a poor guess (a common token, an indent) and a
# long one a good one, the more so inside a copy: priors by match length, after a wrong
# (or no) copy and after a right one, worth two tested tokens each.
PRIOR_ALPHA_BY_N = {1: 0.1, 2: 0.2, 3: 0.35, 4: 0.5, 5: 0.6}
PRIOR_ALPHA_LONG = 0.7
PRIOR_ALPHA_IN_COPY_BY_N = {1: 0.3, 2: 0.45, 3: 0.6, 4: 0.7, 5: 0.8}
PRIOR_ALPHA_IN_COPY_LONG = 0.85
PRIOR_WEIGHT = 2.0
SHADOW_K = 16  # tokens of the n-gram proposal scored each round (at most what a round commits)
# A verify cost seen at one block size only (all rounds at k = 0) is taken to grow in
# proportion to the block, and then no draft pays at a short round trip, so the real slope
# would never be seen: a match that is usually right drafts PROBE_K tokens now and then.
PROBE_ALPHA = 0.8
PROBE_EVERY = 8  # rounds in which such a match went unused
PROBE_K = 4


def drafter_and_end_ids(draft, drafting: str, end_ids) -> tuple:
    """The draft model a loop drafts with (None for "ngram", which runs none) and the tokens that end
    a generation (the draft model's unless given; without a model they must be given)."""
    if drafting not in DRAFTINGS:
        raise ValueError(f"drafting must be {', '.join(DRAFTINGS[:-1])} or {DRAFTINGS[-1]}, got {drafting!r}")
    model = draft if drafting != "ngram" else None
    if model is None and drafting != "ngram":
        raise ValueError(f"drafting {drafting!r} needs a draft model")
    if end_ids is None and draft is None:
        raise ValueError("without a draft model, end_ids must say which tokens end a generation")
    return model, frozenset(end_ids) if end_ids is not None else draft.end_ids


@dataclass(frozen=True)
class RoundPlan:
    source: str  # "model" or "ngram" (an empty draft is "model" with k = 0 in model/mixed, "ngram" in ngram)
    k: int
    proposal: NGramProposal | None = None  # the n-gram draft, when source == "ngram"


class SourceChoice:
    """The n-gram drafter's measured acceptance by match length, and the choice it drives."""

    def __init__(self, drafting: str, max_n: int = MAX_N):
        if drafting not in DRAFTINGS:
            raise ValueError(f"drafting must be one of {', '.join(DRAFTINGS)}, got {drafting!r}")
        self.drafting = drafting
        self.ngram = NGramDrafter(max_n)
        # [in_copy][n]: matches of length n, after a wrong copy (0) or a right one (1)
        self._alpha = [[Decayed() for _ in range(max_n + 1)] for _ in range(2)]
        for in_copy, priors, long in ((0, PRIOR_ALPHA_BY_N, PRIOR_ALPHA_LONG),
                                      (1, PRIOR_ALPHA_IN_COPY_BY_N, PRIOR_ALPHA_IN_COPY_LONG)):
            for n, decayed in enumerate(self._alpha[in_copy][1:], start=1):
                decayed.add(priors.get(n, long), PRIOR_WEIGHT)
        self._shadow: NGramProposal | None = None  # this round's n-gram proposal, to score
        self._in_copy = 0  # 1: the last scored proposal matched all the round committed
        self._unused_good_matches = 0

    def alpha(self, n: int, in_copy: int | None = None) -> float:
        """Measured acceptance of an n-gram draft token after a match of length n (now, or
        `in_copy` 1 after a right copy, 0 after none)."""
        row = self._alpha[self._in_copy if in_copy is None else in_copy]
        return min(row[n].value or 0.0, 0.995) if n > 0 else 0.0

    def threshold(self, controller: AdaptiveK, model_k: int, cap: int) -> int | None:
        """The shortest match length the rule would use now (None: none would win)."""
        model_rate = controller.expected_rate(model_k, controller.alpha)
        for n in range(1, len(self._alpha[0])):
            if self._best_ngram(controller, n, cap)[1] >= model_rate and self.alpha(n) >= controller.alpha:
                return n
        return None

    def plan(self, history: list[int], controller: AdaptiveK, fixed_k: int | None, model_k: int,
             cap: int) -> RoundPlan:
        """This round's source and draft length. `model_k`: the model's k (the controller's choice,
        or the fixed k); `cap`: the longest block allowed (service limit, tokens left)."""
        proposal = self.ngram.propose(history, max(SHADOW_K, cap))
        self._shadow = proposal
        n = proposal.match_len
        if self.drafting == "ngram":
            if fixed_k is not None:
                k = min(cap, fixed_k)
            else:
                k = self._probed(self._best_ngram(controller, n, cap)[0], n, cap)
            return RoundPlan("ngram", k if n else 0, _cut(proposal, k) if n else None)
        if n == 0 or cap == 0:
            return RoundPlan("model", model_k)
        model_rate = controller.expected_rate(model_k, controller.alpha)
        if fixed_k is not None:
            k = min(cap, fixed_k)
            ngram_k, ngram_rate = k, controller.expected_rate(k, self.alpha(n), draft_token_s=0.0)
        else:
            ngram_k, ngram_rate = self._best_ngram(controller, n, cap)
        if ngram_k > 0 and ngram_rate >= model_rate and self.alpha(n) >= controller.alpha:
            return RoundPlan("ngram", ngram_k, _cut(proposal, ngram_k))
        if model_k == 0 and fixed_k is None:  # nothing would be drafted: perhaps a probe
            probe = self._probed(0, n, cap)
            if probe:
                return RoundPlan("ngram", probe, _cut(proposal, probe))
        return RoundPlan("model", model_k)

    def _probed(self, k: int, n: int, cap: int) -> int:
        """k, or PROBE_K every PROBE_EVERY rounds whose usually-right match would draft nothing."""
        if k > 0 or n == 0 or self.alpha(n) < PROBE_ALPHA:
            return k
        self._unused_good_matches += 1
        return min(PROBE_K, cap) if self._unused_good_matches % PROBE_EVERY == 0 else 0

    def score(self, committed: list[int]) -> None:
        """Score this round's n-gram proposal against what the round committed (target tokens)."""
        proposal, self._shadow = self._shadow, None
        if proposal is None or proposal.match_len == 0 or not committed:
            self._in_copy = 0
            return
        known = min(len(proposal.tokens), len(committed))
        matched = 0
        while matched < known and proposal.tokens[matched] == committed[matched]:
            matched += 1
        tested = matched + (1 if matched < known else 0)  # past the known tokens nothing was tested
        if tested:
            self._alpha[self._in_copy][proposal.match_len].add(matched / tested, tested)
        self._in_copy = int(known > 0 and matched == known)

    def _best_ngram(self, controller: AdaptiveK, n: int, cap: int) -> tuple[int, float]:
        """(k, expected tokens/s) of the best n-gram round after a match of length n (k = 0: none)."""
        alpha = self.alpha(n)
        if not controller.verify_measured:  # no costs yet: a moderate block, as adaptive k starts
            k = min(START_K, cap) if n else 0
            return k, controller.expected_rate(k, alpha, draft_token_s=0.0)
        rates = [controller.expected_rate(k, alpha, draft_token_s=0.0) for k in range(cap + 1)]
        best = max(range(cap + 1), key=lambda k: rates[k])
        return best, rates[best]


def _cut(proposal: NGramProposal, k: int) -> NGramProposal:
    return NGramProposal(proposal.tokens[:k], proposal.match_len)
