"""Sampling through the real protocol is distributed exactly as the target alone.

The reference is exact, not sampled: the target's joint distribution of the first tokens,
computed from its warped logits. Speculative samples of those tokens must fit it by a
chi-square test (tests/statistics.py sets the sample size and threshold; the power to catch
a 1% shift is measured in tests/remote_verify/test_acceptance.py), for a drafter that is
nearly always rejected (residual resampling, no truncation) and one that is mostly accepted
(top-k/top-p), with the loop drafting ahead while verdicts are in flight (the fourth token
then usually comes from a block drafted before the first verdict arrived).

Each case costs 30,000 generations (minutes on two cores), so the cases are spread over
the backends. The close drafter, which takes every path of the acceptance rule (acceptance
at two positions, corrections, bonus tokens), runs on torch, the reference backend, and on
llama.cpp drafting ahead; the far drafter (rejections and residual resampling, three requests
per generation) runs on ONNX Runtime, the fastest of the three on tiny models here. The
acceptance rule is the same code on every backend; what a backend adds (its logits, its
cache rollback) is checked token by token by the parity tests and against recomputation by
the session tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from wire.protocol import SamplingParams
from wire.sampling import warp
from tests.conftest import hello_for
from tests.statistics import ALPHA, SAMPLES, chi_square_pvalue

PROMPT_TEXT = "The"


def _exact_first(backend, prompt: list[int], params: SamplingParams, n: int) -> dict[tuple, float]:
    """Joint target distribution of the first n generated tokens: {(t1, .., tn): probability}.

    A generation ends at EOS, so a prefix ending in EOS keeps its mass unextended.
    """
    joint = {(): 1.0}
    for _ in range(n):
        longer = {}
        for prefix, mass in joint.items():
            if prefix and prefix[-1] == backend.eos_id:
                longer[prefix] = mass
                continue
            probs = warp(backend.forward(backend.new_cache(), prompt + list(prefix), n_logits=1)[0], params)
            for token in np.flatnonzero(probs):
                longer[prefix + (int(token),)] = mass * probs[token]
        joint = longer
    return joint


# nearly every draft rejected: residual resampling, then a target-only round
FAR_PLAIN = ("far_draft", SamplingParams(temperature=1.0), 1, 2, False)  # k, tokens tested, ahead
# mostly accepted: acceptance at two positions, corrections and bonus tokens
CLOSE_TOPK_TOPP = ("close_draft", SamplingParams(temperature=1.0, top_k=8, top_p=0.9), 3, 2, False)
# mostly accepted, drafting ahead: tokens 1-2 are drafted (acceptance at two positions), 3 is
# the service's (correction or bonus), and 4 usually comes from a block drafted while the
# first verdict was in flight
CLOSE_AHEAD = ("close_draft", SamplingParams(temperature=1.0, top_k=8, top_p=0.9), 2, 4, True)
CASES = [
    pytest.param("torch", *CLOSE_TOPK_TOPP, id="torch-close-topk-topp"),
    pytest.param("llamacpp", *CLOSE_AHEAD, id="llamacpp-close-topk-topp-ahead"),
    pytest.param("onnx", *FAR_PLAIN, id="onnx-far-plain"),
]


@pytest.mark.parametrize("kind, drafter, params, k, n_tokens, pipeline", CASES)
def test_speculative_samples_follow_the_target_distribution(request, service_on, kind, drafter, params,
                                                            k, n_tokens, pipeline):
    """The first tokens of SAMPLES speculative generations fit the target's exact joint distribution."""
    service = service_on(kind)
    draft = request.getfixturevalue(drafter)
    prompt = draft.tokenize(PROMPT_TEXT)
    backend = service.backend
    joint = _exact_first(backend, prompt, params, n_tokens)
    cells = {tokens: i for i, tokens in enumerate(joint)}  # one more cell: outside the support
    exact = np.append(np.array(list(joint.values())), 0.0)
    client = VerifyClient(service.url, hello_for(draft, params, seed=1234))
    speculator = Speculator(draft, client, params, k=k, seed=1234, pipeline=pipeline)
    counts = np.zeros_like(exact, dtype=np.int64)
    accepted = drafted = ahead_used = 0
    # one more token than tested, so that a round drafted ahead decides the last tested one
    max_tokens = n_tokens + 1 if pipeline else k + 1
    for seed in range(SAMPLES):
        speculator.reseed(seed)  # a seed decides a generation: each sample gets its own
        result = speculator.generate(prompt, max_tokens)
        counts[cells.get(tuple(result.token_ids[:n_tokens]), len(joint))] += 1
        accepted += result.stats.accepted
        drafted += result.stats.drafted
        ahead_used += result.stats.ahead_used
    client.close()
    assert chi_square_pvalue(counts, exact) > ALPHA
    rate = accepted / drafted  # the paths this case is meant to exercise were taken
    assert rate < 0.05 if drafter == "far_draft" else 0.3 < rate < 0.95, rate
    if pipeline:
        assert ahead_used > 0.3 * SAMPLES, ahead_used  # usually, token 4 was drafted ahead
