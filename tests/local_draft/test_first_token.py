"""Time to first token: adaptive k's first round verifies the prompt alone, and the output stays the target's."""

from __future__ import annotations

import pytest

from app.latency_proxy import LatencyProxy
from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from tests.conftest import hello_for
from wire.protocol import SamplingParams

PROMPTS = ["def quicksort(arr):", "The quick brown fox", "class Stack:\n    def push(self, x):", "x = ["]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def slow_link(service_on):
    """The llama.cpp service behind a 5 ms round trip, so a block drafted meanwhile gets finished."""
    proxy = LatencyProxy(service_on("llamacpp").url, rtt_ms=5)
    proxy.start_in_thread()
    yield proxy.url
    proxy.stop()


def generate_rounds(speculator, draft, prompt, max_tokens=MAX_TOKENS):
    """(result, the (tokens, provenance) of each committed round)."""
    rounds = []
    result = speculator.generate(draft.tokenize(prompt), max_tokens,
                                 on_commit=lambda tokens, marks: rounds.append((list(tokens), list(marks))))
    return result, rounds


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "ahead"])
def test_first_round_is_one_target_token_and_output_is_exact(slow_link, close_draft, pipeline):
    """Adaptive k: every generation's first round commits one target token; the tokens equal k = 0's."""
    client = VerifyClient(slow_link, hello_for(close_draft))
    reference = Speculator(close_draft, client, SamplingParams(), k=0)
    adaptive = Speculator(close_draft, client, SamplingParams(), k=None, pipeline=pipeline)
    ahead_used = drafted = 0
    for prompt in PROMPTS:
        expected = reference.generate(close_draft.tokenize(prompt), MAX_TOKENS).token_ids
        result, rounds = generate_rounds(adaptive, close_draft, prompt)
        assert result.token_ids == expected, f"diverged on {prompt!r}"
        assert rounds[0] == ([expected[0]], ["target"])
        drafted += result.stats.drafted
        ahead_used += result.stats.ahead_used
    client.close()
    assert drafted > 0, "adaptive k never drafted after the first round"
    if pipeline:  # the block drafted while the prompt was verified is the second round's
        assert ahead_used > 0, "no block drafted during the first round was used"


def test_fixed_k_drafts_from_the_first_round(slow_link, close_draft):
    """A fixed k is taken at its word: the first round already carries k draft tokens."""
    client = VerifyClient(slow_link, hello_for(close_draft))
    result, rounds = generate_rounds(Speculator(close_draft, client, SamplingParams(), k=4), close_draft, PROMPTS[0])
    client.close()
    assert result.stats.drafted_per_position[:4] and "draft" in rounds[0][1]


def test_block_drafted_while_the_prompt_is_verified_is_used(slow_link, close_draft):
    """Drafting ahead: the second round's block was drafted during the first round (the only room for it in 6 tokens)."""
    client = VerifyClient(slow_link, hello_for(close_draft))
    reference = Speculator(close_draft, client, SamplingParams(), k=0).generate(close_draft.tokenize(PROMPTS[0]), 6)
    speculator = Speculator(close_draft, client, SamplingParams(), k=None, pipeline=True)
    result, rounds = generate_rounds(speculator, close_draft, PROMPTS[0], 6)
    client.close()
    assert result.token_ids == reference.token_ids
    assert len(rounds[0][0]) == 1 and result.stats.ahead_used > 0



def test_a_new_prompt_is_timed_as_the_block_it_is(service_on, close_draft):
    """The first round of a new prompt follows a Sync: the service runs every token the new
    history does not share with the old one, and the controller must see that many fed tokens,
    not 1 (a prompt timed as one decode step made steps look 3x dearer, and k = 1 look cheap)."""
    client = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    speculator = Speculator(close_draft, client, SamplingParams(), k=None)
    timings = []
    observe = speculator.controller.observe
    speculator.controller.observe = lambda timing: (timings.append(timing), observe(timing))
    first, second = close_draft.tokenize(PROMPTS[0]), close_draft.tokenize(PROMPTS[1])
    speculator.generate(first, 4)
    timings.clear()
    speculator.generate(second, 4)
    client.close()
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)  # a BOS, say: kept in the cache
    assert timings[0].k == 0 and timings[0].fed_tokens == len(second) - shared
    assert all(timing.fed_tokens == timing.k + 1 for timing in timings[1:])
