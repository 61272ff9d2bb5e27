"""A reply's first token is shown when its frame comes, not after the drafter's step under way
(local_draft/first_frame.py), and the text is the target's."""

from __future__ import annotations

import threading
import time

import pytest

from local_draft.server_only import ServerOnlyGenerator
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from tests.conftest import behind_round_trip, hello_for
from wire.protocol import SamplingParams

PROMPTS = ["def quicksort(arr):", "class Stack:\n    def push(self, x):"]
REPLY_TOKENS = 4
SLOW_STEP_S = 0.8  # each drafter step this much longer: a drafter far slower than the tiny target's pass
# The service behind this round trip: a first frame later than the loop's own start on a busy machine
# (the tiny target's first pass takes a few ms), so that a step is under way when it comes.
RTT_MS = 100


@pytest.fixture(scope="module")
def far_service(service_on):
    with behind_round_trip(service_on("llamacpp").url, RTT_MS) as url:
        yield url


@pytest.fixture
def slow_drafter(close_draft, monkeypatch):
    """The tiny drafter with every step (reading text, a guess, a tree's level) SLOW_STEP_S longer;
    records when each step began and whether two ever ran at once (a draft model does one thing at a time)."""
    began, overlapped, lock, running = [], [], threading.Lock(), [0]

    def slowed(name):
        true_step = getattr(close_draft, name)

        def step(*args, **kwargs):
            with lock:
                running[0] += 1
                overlapped.append(running[0] > 1)
                began.append(time.perf_counter())
            try:
                time.sleep(SLOW_STEP_S)
                return true_step(*args, **kwargs)
            finally:
                with lock:
                    running[0] -= 1

        monkeypatch.setattr(close_draft, name, step)

    for name in ("keep_up", "guess", "branch_guesses"):
        slowed(name)
    return close_draft, began, overlapped


@pytest.mark.parametrize("watch_s", [None, 0.002], ids=["default", "watched-anew"])
def test_the_first_token_is_shown_while_the_drafters_step_runs(far_service, slow_drafter, monkeypatch, watch_s):
    """A service 100 ms away (the drafter guesses from the prompt's pass on), `--k 4` (drafting on whatever the
    service's costs say: on this CPU they say rest) and a seed: each reply's drafter is mid-step when the
    first frame comes, and the first token is shown within half a step of the request, where waiting for
    the step would take a whole one. The replies are server-only's. `watched-anew`: each wait on the socket
    ends (without a frame) long before the frame comes, and is started again; none is taken for the frame."""
    if watch_s is not None:
        monkeypatch.setattr("local_draft.first_frame.WATCH_S", watch_s)
    draft, began, overlapped = slow_drafter
    url = far_service
    reference_client = VerifyClient(url, hello_for(draft))
    reference = ServerOnlyGenerator(reference_client, draft.end_ids)
    expected = {prompt: reference.generate(draft.tokenize(prompt), REPLY_TOKENS).token_ids for prompt in PROMPTS}
    reference_client.close()

    client = VerifyClient(url, hello_for(draft))
    speculator = StreamSpeculator(draft, client, SamplingParams(), seed=3, max_block=4, colocated=False)
    for prompt in PROMPTS:
        began.clear()
        asked = time.perf_counter()
        shown = []
        result = speculator.generate(draft.tokenize(prompt), REPLY_TOKENS,
                                     on_commit=lambda tokens, _: shown.append(time.perf_counter()))
        assert result.token_ids == expected[prompt], prompt
        assert began and began[0] < shown[0], (prompt, "no drafter step began before the first token")
        assert shown[0] - asked < SLOW_STEP_S / 2, (prompt, shown[0] - asked)
    client.close()
    assert overlapped and not any(overlapped), "two drafter steps ran at once"
