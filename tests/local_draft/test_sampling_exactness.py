"""Sampling through the real protocol is distributed exactly as the target alone.

The reference is exact, not sampled: the target's warped distributions for the first two
tokens, computed from its logits. Speculative samples of those two tokens (a round of k = 3
drafts, so acceptance, residual resampling and the bonus all occur) must fit it by a
chi-square test. 40,000 samples catch a 1% shift of mass (tests/remote_verify/test_acceptance.py
measures that power on the same test statistic).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from remote_verify.protocol import SamplingParams
from remote_verify.sampling import warp
from tests.conftest import hello_for

SAMPLES = 40_000
PROMPT_TEXT = "The"


def _exact_first_two(backend, prompt: list[int], params: SamplingParams) -> np.ndarray:
    """Joint target distribution (V*V,) of the first two generated tokens."""
    vocab = backend.vocab_size
    p0 = warp(backend.forward(backend.new_cache(), prompt, n_logits=1)[0], params)
    joint = np.zeros((vocab, vocab))
    for first in np.flatnonzero(p0):
        logits = backend.forward(backend.new_cache(), prompt + [int(first)], n_logits=1)[0]
        joint[first] = p0[first] * warp(logits, params)
    return joint.ravel()


def _p_value(counts: np.ndarray, exact: np.ndarray) -> float:
    if counts[exact == 0].any():
        return 0.0
    keep = exact * counts.sum() >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(exact[keep], exact[~keep].sum()) * counts.sum()
    return float(stats.chisquare(observed[expected > 0], expected[expected > 0]).pvalue)


@pytest.mark.parametrize(
    "drafter, params",
    [
        ("far_draft", SamplingParams(temperature=1.0)),  # nearly every draft rejected: residuals
        ("close_draft", SamplingParams(temperature=1.0, top_k=8, top_p=0.9)),  # mostly accepted: bonus
    ],
    ids=["far-plain", "close-topk-topp"],
)
def test_speculative_samples_follow_the_target_distribution(request, service, torch_target, drafter, params):
    """First two tokens of 40,000 speculative generations fit the target's exact distribution."""
    draft = request.getfixturevalue(drafter)
    prompt = draft.tokenize(PROMPT_TEXT)
    exact = _exact_first_two(torch_target, prompt, params)
    client = VerifyClient(service.url, hello_for(draft, params, seed=1234))
    speculator = Speculator(draft, client, params, k=3, seed=99)
    counts = np.zeros_like(exact, dtype=np.int64)
    accepted = drafted = 0
    for _ in range(SAMPLES):
        result = speculator.generate(prompt, 4)  # one round: 3 drafts + 1
        first, second = result.token_ids[:2]
        counts[first * torch_target.vocab_size + second] += 1
        accepted += result.stats.accepted
        drafted += result.stats.drafted
    client.close()
    assert _p_value(counts, exact) > 1e-3
    rate = accepted / drafted  # the paths this case is meant to exercise were taken
    assert rate < 0.05 if drafter == "far_draft" else 0.3 < rate < 0.95, rate
