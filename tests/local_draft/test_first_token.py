"""Time to first token: adaptive k's first round verifies the prompt alone, and the output stays the target's."""

from __future__ import annotations

import pytest

from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from tests.conftest import behind_round_trip, hello_for
from wire.protocol import SamplingParams

PROMPTS = ["def quicksort(arr):", "The quick brown fox", "class Stack:\n    def push(self, x):", "x = ["]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def slow_link(service_on):
    """The llama.cpp service behind a 5 ms round trip, so a block drafted meanwhile gets finished."""
    with behind_round_trip(service_on("llamacpp").url, 5) as url:
        yield url


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


def test_a_service_on_this_machine_is_one_on_a_loopback_address():
    from local_draft.verify_client import on_this_machine

    assert on_this_machine("ws://127.0.0.1:8765") and on_this_machine("wss://localhost/x")
    assert on_this_machine("ws://[::1]:9000")
    assert not on_this_machine("wss://verify.example.com:443") and not on_this_machine("ws://10.0.0.7:8765")


class StubClient:
    """Stands in for a VerifyClient in the two tests below, which check a stopping rule, not a service."""

    def __init__(self, url: str):
        from local_draft.verify_client import on_this_machine

        self.on_this_machine = on_this_machine(url)
        self.ready = False

    def reply_ready(self) -> bool:
        return self.ready


def prompt_round_stop(url: str, wire_s: float | None):
    import time

    from local_draft.adaptive_k import RoundTiming

    speculator = Speculator(None, None, SamplingParams(), drafting="ngram", end_ids=[0])
    if wire_s is not None:
        speculator.controller.observe(RoundTiming(k=0, accepted=0, draft_s=0.0, draft_tokens=0, fed_tokens=1,
                                                  service_s=0.05, wire_s=wire_s))
    speculator._client = StubClient(url)
    return speculator._client, speculator._prompt_round_stop(time.perf_counter())


def test_beside_a_local_service_the_prompt_is_read_only_while_the_round_trip_travels():
    """A service on this machine computes on the drafter's cores: the first round's reading stops
    after the measured wire time (here 30 ms), or at the verdict if it comes sooner."""
    import time

    client, stop = prompt_round_stop("ws://127.0.0.1:1234", wire_s=0.03)
    assert not stop()
    time.sleep(0.04)
    assert stop()
    client, stop = prompt_round_stop("ws://127.0.0.1:1234", wire_s=0.03)
    client.ready = True
    assert stop()


def test_with_a_remote_service_or_no_measurement_the_prompt_is_read_until_the_verdict():
    """A remote service, or any service before a wire time was measured: read until the verdict comes."""
    import time

    for url, wire_s in (("wss://verify.example.com", 0.0), ("ws://127.0.0.1:1234", None)):
        client, stop = prompt_round_stop(url, wire_s)
        time.sleep(0.01)
        assert not stop()
        client.ready = True
        assert stop()


def test_a_drafter_behind_the_text_reads_at_k_0_then_drafts(service_on, close_draft):
    """When the first round left the prompt unread (a local service, a short wire time), adaptive
    k's next rounds are k = 0 while the drafter reads it a piece a round, even beside a service
    that answers before a piece is done; then it drafts. The output stays the target's."""
    from local_draft.draft_model import CATCH_UP_PIECE

    client = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    reference = Speculator(close_draft, client, SamplingParams(), k=0)
    speculator = Speculator(close_draft, client, SamplingParams(), k=None, pipeline=True)
    speculator._prompt_round_stop = lambda sent: (lambda: True)  # as a local service with no wire time
    client.reply_ready = lambda: True  # as a service that answers before the drafter reads a piece
    prompt = "def push(x, y):"  # read a piece a round, one token gained a round: a short prompt
    expected = reference.generate(close_draft.tokenize(prompt), 3 * MAX_TOKENS).token_ids
    lags = []
    keep_up = speculator._keep_drafter_up
    speculator._keep_drafter_up = lambda history, *args, **kwargs: (
        keep_up(history, *args, **kwargs), lags.append(close_draft.lag(history)))
    result, rounds = generate_rounds(speculator, close_draft, prompt, 3 * MAX_TOKENS)
    client.close()
    assert result.token_ids == expected
    ids = close_draft.tokenize(prompt)
    assert lags[0] >= len(ids) - 2, "the drafter read the prompt during the first round"
    reading = [lag for lag in lags[1:] if lag > 2]
    assert reading and all(b <= a - CATCH_UP_PIECE + 1 for a, b in zip(reading, reading[1:])), lags
    assert all(len(tokens) == 1 for tokens, _ in rounds[:len(reading) + 1])  # k = 0 while reading
    assert result.stats.drafted > 0, "adaptive k never drafted after the drafter caught up"
