"""Sampling in the default mode (streamed, guesses verified as they arrive) is distributed as the target's.

In a stream the target picks every token itself (argmax, or the race of its warped distribution
over the session's clocks for that position: wire/sampling.py) and a guess is kept only where it
equals that pick, so the text is a function of the seed alone. tests/local_draft/
test_stream_speculator.py shows the consequence token for token (seeded streams with guesses are
the seeded stream alone); here the distribution itself is tested, through the real protocol, on
a service paced like a GPU so that most tokens are kept guesses (tests/conftest.py
`paced_service`), against the target's exact joint distribution of the first tokens, and with
the two bugs a stream's verification could plausibly have planted back, each of which the test
must catch: a guess kept without comparing it with the target's pick, and the pick read from
the row of the next position.

Power (tests/statistics.py `detectable_shift` on this case's exact distribution): with
STREAM_SAMPLES draws the test catches a shift of STREAM_POWER of probability mass between the
two likeliest outcomes 90% of the time.
"""

from __future__ import annotations

import pytest

from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from remote_verify.session import Session
from wire.protocol import SamplingParams
from tests.conftest import hello_for
from tests.local_draft.test_sampling_exactness import Tally
from tests.statistics import ALPHA, detectable_shift

PARAMS = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
TOKENS = 2  # the first two tokens, jointly
STREAM_SAMPLES = 5_000
STREAM_POWER = 0.03  # detectable_shift(tally.exact, STREAM_SAMPLES) is at most this, asserted below
PLANTED_SAMPLES = 1_000  # a planted bug shifts far more than a point: fewer draws find it


def _tally(service, draft, samples: int, first_seed: int) -> tuple[Tally, int]:
    """`samples` seeded streams of TOKENS tokens with guesses (k = 4); returns the tally and how
    many had their second token from a kept guess. The service stands for a GPU
    elsewhere (colocated=False): the drafter reads the prompt and guesses while the prompt's
    pass runs: the second token, decided by the next pass, is a kept guess when the guess for
    the first was right and the one for the second arrived in time and was right (about 30%)."""
    tally = Tally(service, draft, PARAMS, TOKENS)
    client = VerifyClient(service.url, hello_for(draft, PARAMS, seed=first_seed))
    speculator = StreamSpeculator(draft, client, PARAMS, seed=first_seed, max_block=4, colocated=False)
    kept = 0
    for seed in range(first_seed, first_seed + samples):
        speculator.reseed(seed)
        marks: list[str] = []
        result = speculator.generate(tally.prompt, TOKENS + 1, lambda tokens, provenance: marks.extend(provenance))
        kept += marks[1] == "draft"
        tally.add(result)
    client.close()
    return tally, kept


def test_streamed_samples_with_guesses_follow_the_target_distribution(paced_service, close_draft):
    """The first two tokens of STREAM_SAMPLES streams, most of them kept guesses, fit the target's
    exact joint distribution."""
    tally, kept = _tally(paced_service, close_draft, STREAM_SAMPLES, 7_000_000)
    assert tally.pvalue() > ALPHA
    # the second token was often a kept guess: the path under test was taken (how often depends on
    # the machine's speed: a guess must reach the service within the prompt's pass)
    assert kept > STREAM_SAMPLES / 20, kept
    assert detectable_shift(tally.exact, STREAM_SAMPLES) <= STREAM_POWER


def _kept_without_comparing(self, result, position, row):
    """Planted: the pick at a row that had a guess in this pass is the guess itself."""
    start, guesses = _GUESSES_OF_THE_PASS.get(id(self), (0, []))
    if start == position and row < len(guesses):
        return guesses[row]
    return _TRUE_PICK(self, result, position, row)


_TRUE_PICK = Session._target_pick
_GUESSES_OF_THE_PASS: dict = {}  # session -> (position of its pass's first guess, the guesses)


@pytest.mark.parametrize("bug", ["guess_kept_without_comparing", "pick_from_the_next_row"])
def test_a_planted_verification_bug_turns_the_test_red(paced_service, close_draft, monkeypatch, bug):
    """With either bug planted in the service's verification, the same test fails."""
    if bug == "pick_from_the_next_row":
        def planted(self, result, position, row):
            return _TRUE_PICK(self, result, position, min(row + 1, len(result) - 1))
    else:
        true_plan = Session._plan_stream_pass

        def plan_remembering_guesses(self, drafts, stop_ids, room, costs, so_far=None):
            planned = true_plan(self, drafts, stop_ids, room, costs, so_far)
            guesses = list(planned.share.tokens[len(planned.share.tokens) - planned.share.n_logits + 1:])
            _GUESSES_OF_THE_PASS[id(self)] = (len(self.committed), guesses)
            return planned

        monkeypatch.setattr(Session, "_plan_stream_pass", plan_remembering_guesses)
        planted = _kept_without_comparing
    monkeypatch.setattr(Session, "_target_pick", planted)
    tally, _ = _tally(paced_service, close_draft, PLANTED_SAMPLES, 8_000_000)
    _GUESSES_OF_THE_PASS.clear()
    assert tally.pvalue() < ALPHA
