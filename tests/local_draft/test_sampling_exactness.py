"""Sampling through the real protocol is distributed exactly as the target alone.

The reference is exact, not sampled: the target's warped distributions for the first two
tokens, computed from its logits. Speculative samples of those two tokens must fit it by a
chi-square test (tests/statistics.py sets the sample size and threshold; the power to catch
a 1% shift is measured in tests/remote_verify/test_acceptance.py), for a drafter that is
nearly always rejected (residual resampling) and one that is mostly accepted (acceptance at
two positions, corrections and bonus tokens), with and without top-k/top-p.

Each case costs 30,000 generations (minutes on two cores), so the cases are spread over
the backends: every backend runs the close drafter, which takes every path of the
acceptance rule; the far drafter runs on torch, the reference backend. The acceptance rule
is the same code on every backend; what a backend adds (its logits, its cache rollback) is
also checked token by token by the parity tests and against recomputation by the session
tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from remote_verify.protocol import SamplingParams
from remote_verify.sampling import warp
from tests.conftest import BACKENDS, hello_for
from tests.statistics import ALPHA, SAMPLES, chi_square_pvalue

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


# nearly every draft rejected: residual resampling, then a target-only round
FAR_PLAIN = ("far_draft", SamplingParams(temperature=1.0), 1, 2)
# mostly accepted: acceptance at two positions, corrections and bonus tokens
CLOSE_TOPK_TOPP = ("close_draft", SamplingParams(temperature=1.0, top_k=8, top_p=0.9), 3, 4)
CASES = [pytest.param("torch", *FAR_PLAIN, id="torch-far-plain")] + [
    pytest.param(kind, *CLOSE_TOPK_TOPP, id=f"{kind}-close-topk-topp") for kind in BACKENDS]


@pytest.mark.parametrize("kind, drafter, params, k, max_tokens", CASES)
def test_speculative_samples_follow_the_target_distribution(request, service_on, kind, drafter, params,
                                                            k, max_tokens):
    """The first two tokens of SAMPLES speculative generations fit the target's exact distribution."""
    service = service_on(kind)
    draft = request.getfixturevalue(drafter)
    prompt = draft.tokenize(PROMPT_TEXT)
    backend = service.backend
    exact = _exact_first_two(backend, prompt, params)
    client = VerifyClient(service.url, hello_for(draft, params, seed=1234))
    speculator = Speculator(draft, client, params, k=k, seed=99)
    counts = np.zeros_like(exact, dtype=np.int64)
    accepted = drafted = 0
    for _ in range(SAMPLES):
        result = speculator.generate(prompt, max_tokens)
        first, second = result.token_ids[:2]
        counts[first * backend.vocab_size + second] += 1
        accepted += result.stats.accepted
        drafted += result.stats.drafted
    client.close()
    assert chi_square_pvalue(counts, exact) > ALPHA
    rate = accepted / drafted  # the paths this case is meant to exercise were taken
    assert rate < 0.05 if drafter == "far_draft" else 0.3 < rate < 0.95, rate
