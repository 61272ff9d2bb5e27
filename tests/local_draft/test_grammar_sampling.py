"""Sampled under a JSON schema, the default mode's replies are distributed as the constrained target's.

The reference is exact: the target's distribution of whole replies under the schema, every
step's logits masked by the grammar, then warped (tests/local_draft/test_stream_grammar.py's
`constrained_target_alone` takes the same steps one seed at a time). The schema is small on
purpose: an array of two of 1, 2, 3, so a reply is six tokens (`[`, a digit, `,`, a digit,
`]`, the end), half of them forced by the grammar, and there are nine replies to count. The
replies are drawn through the real protocol in the default mode (streamed, guesses verified as
they arrive) on a service paced like a GPU (tests/conftest.py `paced_service`), so that the
drafter's masked guesses are kept where it keeps ahead: the forced tokens and the digits
alike.

Two bugs a grammar under speculation could plausibly have, each kept below as a planted case
the test must catch:
- the service races first and masks after: the race over the target's unmasked distribution,
  and where its pick is a token the grammar refuses, the masked argmax in its place (the reply
  still parses; the digits lean to the likeliest);
- only the drafter masks: the service ignores the grammar (the replies leave it).

Power (tests/statistics.py `detectable_shift` on this case's exact distribution, asserted
below): with SAMPLES replies the test catches a shift of POWER of probability mass between the
two likeliest replies 90% of the time.
"""

from __future__ import annotations

import json

import numpy as np

from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from remote_verify.session import Session
from wire import grammar as grammars
from wire.protocol import Grammar, SamplingParams
from wire.sampling import race_choice, warp
from tests.conftest import hello_for
from tests.forked_seeds import map_seeds, service_here
from tests.statistics import ALPHA, chi_square_pvalue, detectable_shift

SCHEMA = {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "maxItems": 2}
GRAMMAR = Grammar("json_schema", json.dumps(SCHEMA))
PARAMS = SamplingParams(temperature=1.5)  # spreads the tiny target's mass over more of the nine replies
PROMPT_TEXT = "The"
REPLY_TOKENS = 6  # the longest reply, its end token included
SAMPLES = 1_000
POWER = 0.07  # detectable_shift(exact, SAMPLES) is at most this: 6.4 points when written
# The planted bugs move tens of points (the mask after the race: most of the digits' mass; the
# drafter alone: every reply leaves the grammar), so far fewer replies show them.
PLANTED_RACE_SAMPLES = 60  # every one of 150 replies on three seed ranges was the likeliest: p < 1e-40
PLANTED_DRAFTER_SAMPLES = 40


def exact_replies(target, prompt: list[int], end_ids: list[int]) -> dict[tuple, float]:
    """{reply's tokens: probability} of the constrained target alone: each step's logits masked by
    the grammar, warped, and every allowed token followed to the reply's end."""
    vocab = grammars.vocab_for(f"reference:{id(target)}", load=target.token_texts, n_vocab=target.vocab_size)
    constraint = grammars.TokenConstraint(GRAMMAR, vocab, end_ids)
    growing, replies = {(): 1.0}, {}
    while growing:
        longer = {}
        for prefix, mass in growing.items():
            if prefix and prefix[-1] in end_ids:
                replies[prefix] = mass
                continue
            assert len(prefix) < REPLY_TOKENS and constraint.follow(list(prefix))
            probs = warp(constraint.mask(target.forward(target.new_cache(), prompt + list(prefix), 1)[0]), PARAMS)
            for token in np.flatnonzero(probs):
                longer[prefix + (int(token),)] = mass * probs[token]
        growing = longer
    return replies


class ReplyTally:
    """Counts of whole replies against the exact distribution; one more cell for a reply outside it."""

    def __init__(self, exact: dict[tuple, float]):
        self.cells = {reply: i for i, reply in enumerate(exact)}
        self.exact = np.append(np.array(list(exact.values())), 0.0)
        self.counts = np.zeros_like(self.exact, dtype=np.int64)

    def add(self, tokens: list[int]) -> None:
        self.counts[self.cells.get(tuple(tokens), len(self.cells))] += 1

    def pvalue(self) -> float:
        return chi_square_pvalue(self.counts, self.exact)


def _tally(service, draft, seeds: range) -> tuple[ReplyTally, int]:
    """One seeded default-mode reply under the schema per seed, on one session re-keyed per seed;
    the tally and how many of the tokens made were kept guesses."""
    end_ids = sorted(draft.end_ids)
    prompt = draft.tokenize(PROMPT_TEXT)
    tally = ReplyTally(exact_replies(service.backend, prompt, end_ids))

    def replies(share: range) -> list:
        with service_here(service) as url:
            client = VerifyClient(url, hello_for(draft, PARAMS, seed=share[0]))
            speculator = StreamSpeculator(draft, client, PARAMS, seed=share[0], max_block=4, colocated=False,
                                          end_ids=end_ids, grammar=GRAMMAR)
            made = []
            for seed in share:
                speculator.reseed(seed)
                marks: list[str] = []
                result = speculator.generate(prompt, REPLY_TOKENS + 2,
                                             lambda tokens, provenance: marks.extend(provenance))
                made.append((result.token_ids, marks.count("draft")))
            client.close()
        return made

    kept = 0
    for tokens, kept_guesses in map_seeds(replies, seeds, paced=True):
        tally.add(tokens)
        kept += kept_guesses
    return tally, kept


def test_sampled_replies_under_a_schema_follow_the_constrained_target(paced_service, close_draft):
    """SAMPLES seeded replies, many of their tokens kept guesses, fit the constrained target's exact
    distribution of replies."""
    tally, kept = _tally(paced_service, close_draft, range(12_000_000, 12_000_000 + SAMPLES))
    assert detectable_shift(tally.exact, SAMPLES) <= POWER  # the power the file states
    assert tally.pvalue() > ALPHA, (tally.pvalue(), tally.counts, tally.exact)
    # the path under test was taken: guesses were kept (how many depends on the machine's speed)
    assert kept > SAMPLES / 2, kept


def _race_then_mask(self, result, position, row, depth, before=()):
    """Planted: the race over the target's unmasked distribution, the grammar applied to its pick
    after (a refused pick replaced by the most likely allowed token)."""
    if self.grammar is None or (self.sampling.greedy and result.ndim == 1):
        return _TRUE_PICK(self, result, position, row, depth, before)
    probs = warp(result[row], self.sampling)
    pick = race_choice(probs, self.randomness.race(position + depth, probs.shape[0]))
    masked = self._row_logits(result, row, list(before))
    return pick if np.isfinite(masked[pick]) else int(np.argmax(masked))


_TRUE_PICK = Session._target_pick


def test_a_mask_applied_after_the_race_turns_the_test_red(paced_service, close_draft, monkeypatch):
    """With the service's mask applied after its race, the replies still parse but the test fails."""
    monkeypatch.setattr(Session, "_target_pick", _race_then_mask)
    tally, _ = _tally(paced_service, close_draft, range(12_500_000, 12_500_000 + PLANTED_RACE_SAMPLES))
    assert tally.counts[-1] == 0, "every reply is still inside the grammar: only the distribution is wrong"
    assert tally.pvalue() < ALPHA, (tally.pvalue(), tally.counts, tally.exact)


def test_a_mask_on_the_drafter_alone_turns_the_test_red(paced_service, close_draft, monkeypatch):
    """With the service ignoring the grammar (only the drafter masks), the test fails."""
    monkeypatch.setattr(Session, "_constraint", lambda self, grammar, history, stop_ids: None)
    tally, _ = _tally(paced_service, close_draft, range(12_700_000, 12_700_000 + PLANTED_DRAFTER_SAMPLES))
    assert tally.pvalue() < ALPHA, (tally.pvalue(), tally.counts, tally.exact)
