"""Greedy parity: speculation through the real service gives exactly the target-only tokens."""

from __future__ import annotations

import pytest

from app.latency_proxy import LatencyProxy
from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from wire.protocol import SamplingParams
from tests.conftest import hello_for

PROMPTS = [
    "def quicksort(arr):", "The quick brown fox", "import numpy as np\n", "Once upon a time",
    "class Stack:\n    def push(self, x):", "SELECT * FROM users WHERE", "for i in range(10):",
    "Dear team,", "# TODO: fix the", "return self.", "1, 2, 3, 5, 8,", "<html><body>",
    "The capital of France is", "éàü 中文 🎉", "if __name__ == '__main__':", "x = [",
    "and then the", "    ", "print('hello')", "A",
]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def reference(service, close_draft):
    """Target-only output (k = 0) for every prompt."""
    client = VerifyClient(service.url, hello_for(close_draft))
    speculator = Speculator(close_draft, client, SamplingParams(), k=0)
    outputs = {p: speculator.generate(close_draft.tokenize(p), MAX_TOKENS).token_ids for p in PROMPTS}
    client.close()
    return outputs


# (k, drafting ahead): fixed k, adaptive k (None), and drafting ahead while verdicts fly
LOOPS = [(1, False), (3, False), (8, False), (None, False), (4, True), (None, True)]
# Drafting ahead stops when the verdict arrives; on loopback a tiny target can answer before
# the first token ahead is drafted. Behind a 5 ms round trip (still far below a real link)
# the block ahead is always finished, so the path is taken on every machine.
AHEAD_RTT_MS = 5


@pytest.fixture(scope="module")
def ahead_link(service):
    """The service behind an emulated round trip, for the loops that draft ahead."""
    proxy = LatencyProxy(service.url, rtt_ms=AHEAD_RTT_MS)
    proxy.start_in_thread()
    yield proxy.url
    proxy.stop()


@pytest.mark.parametrize("drafter", ["close_draft", "far_draft"])
@pytest.mark.parametrize("k, pipeline", LOOPS, ids=["k1", "k3", "k8", "auto", "k4-ahead", "auto-ahead"])
def test_greedy_speculation_is_token_identical_to_the_target(request, service, reference, drafter, k, pipeline):
    """Every prompt, both drafters, fixed and adaptive k, with and without drafting ahead: same tokens as k = 0."""
    draft = request.getfixturevalue(drafter)
    url = request.getfixturevalue("ahead_link") if pipeline else service.url
    client = VerifyClient(url, hello_for(draft))  # one session: later prompts Sync
    speculator = Speculator(draft, client, SamplingParams(), k=k, pipeline=pipeline)
    accepted = drafted = ahead_used = 0
    for prompt in PROMPTS:
        result = speculator.generate(draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == reference[prompt], f"diverged on {prompt!r}"
        accepted += result.stats.accepted
        drafted += result.stats.drafted
        ahead_used += result.stats.ahead_used
    client.close()
    if k is None:  # adaptive k may stop drafting altogether where it does not pay
        return
    rate = accepted / drafted
    if drafter == "close_draft":
        assert rate > 0.6, f"close drafter accepted only {rate:.2f}"
        assert not pipeline or ahead_used > 0.2 * drafted, "blocks drafted ahead were never used"
    else:
        assert rate < 0.2, f"far drafter accepted {rate:.2f}"


@pytest.mark.parametrize("drafter", ["close_draft", "far_draft"])
def test_client_and_service_agree_after_every_round(request, service, drafter):
    """After zero, partial and full acceptance, drafter cache, client and service agree."""
    draft = request.getfixturevalue(drafter)
    client = VerifyClient(service.url, hello_for(draft))
    session = service.service.sessions[client.welcome.session_id]
    speculator = Speculator(draft, client, SamplingParams(), k=4)
    history = draft.tokenize("The quick brown fox")
    seen = set()
    for _ in range(30):
        result = speculator.generate(history, 5)  # one round per call: 4 drafted + 1
        history += result.token_ids
        seen.add(result.stats.accepted)
        assert session.committed == history
        assert session.cached_len == len(history) - 1
        assert draft.evaluated == history[: len(draft.evaluated)]
    client.close()
    # both kinds of roll back were exercised: full acceptance and a rejection
    assert 0 in seen if drafter == "far_draft" else (4 in seen and min(seen) < 4), seen


def test_a_512_token_generation_keeps_parity(service, close_draft):
    """A long generation (many rollbacks, a long KV cache) stays token-identical."""
    prompt = close_draft.tokenize("def main():")
    outputs = {}
    for k in (0, 5):
        client = VerifyClient(service.url, hello_for(close_draft))
        outputs[k] = Speculator(close_draft, client, SamplingParams(), k=k).generate(prompt, 512)
        client.close()
    assert len(outputs[0].token_ids) == 512 or outputs[0].stop_reason == "eos"
    assert outputs[5].token_ids == outputs[0].token_ids
