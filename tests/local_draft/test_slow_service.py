"""A service slow to read a long prompt is waited for, not taken for a lost one."""

from __future__ import annotations

import time

from local_draft.service_link import ServiceLink
from local_draft.speculator import Speculator
from tests.conftest import RunningService, hello_for
from wire.protocol import SamplingParams

SECONDS_PER_PROMPT_TOKEN = 0.1  # twice the rate the client expects (SECONDS_PER_NEW_TOKEN)
PROMPT_TOKENS = 40  # 4 s to read it, with a stall timeout of 0.5 s


class SlowPrefillTarget:
    """The real target, taking SECONDS_PER_PROMPT_TOKEN for every token of a long forward pass
    (a large model reading a prompt on a CPU); the rounds after it are fast. Armed once the service
    is up: its start-up passes, which time the cost curve, run at the target's own speed."""

    def __init__(self, target):
        self._target = target
        self.slow_forwards = 0
        self.armed = False

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward(self, cache, tokens, n_logits):
        if self.armed and len(tokens) > 8:
            time.sleep(SECONDS_PER_PROMPT_TOKEN * len(tokens))
            self.slow_forwards += 1
        return self._target.forward(cache, tokens, n_logits)

    def forward_many(self, passes):  # the service's path: its rounds may share a pass
        longest = max(len(each.tokens) for each in passes)
        if self.armed and longest > 8:
            time.sleep(SECONDS_PER_PROMPT_TOKEN * longest)
            self.slow_forwards += 1
        return self._target.forward_many(passes)


def test_a_prompt_the_service_reads_slowly_is_verified_not_taken_for_a_lost_service(own_llamacpp_target, close_draft):
    """The first round carries a prompt the service needs 4 s for, far past the expected time and the
    0.5 s stall timeout; the service answers pings meanwhile, so the round is waited for and verified."""
    slow = SlowPrefillTarget(own_llamacpp_target)
    running = RunningService(slow)
    slow.armed = True
    link = ServiceLink(running.url, hello_for(close_draft), stall_timeout_s=0.5)
    prompt = close_draft.tokenize("def quicksort(arr):\n    " * 8)[:PROMPT_TOKENS]
    assert len(prompt) == PROMPT_TOKENS
    try:
        started = time.monotonic()
        result = Speculator(close_draft, link, SamplingParams(), k=4).generate(prompt, 8)
        took = time.monotonic() - started
    finally:
        link.close()
        running.close()
    assert slow.slow_forwards == 1 and took >= SECONDS_PER_PROMPT_TOKEN * PROMPT_TOKENS
    assert result.stats.offline == 0 and link.connections == 1 and len(result.token_ids) == 8


def test_a_late_welcome_is_waited_for_while_the_service_answers_pings(close_draft):
    """A service that takes 3 s to welcome (many clients arriving together, a loaded host) but answers
    pings meanwhile: a client with a 1 s stall timeout waits, as it does for a slow verdict, and is
    welcomed. (It used to give up at 1 s: "did not answer within 1 s".)"""
    from local_draft.verify_client import VerifyClient
    from tests.fake_service import FakeService, honest_answer

    fake = FakeService(honest_answer(), welcome_delay_s=3.0)
    try:
        started = time.monotonic()
        client = VerifyClient(fake.url, hello_for(close_draft), stall_timeout_s=1.0)
        client.close()
    finally:
        fake.close()
    assert client.welcome.session_id == "fake" and time.monotonic() - started >= 3.0


class QueuedStepTarget:
    """The real target, whose STEP_AT-th pass once waits QUEUED_S first (other sessions' work ahead of
    this one's step: their prompts, a KV pool growing for newcomers). Armed once the service is up."""

    STEP_AT = 4
    QUEUED_S = 3.0

    def __init__(self, target):
        self._target = target
        self.passes = 0
        self.armed = False

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward_many(self, passes):
        if self.armed:
            self.passes += 1
            if self.passes == self.STEP_AT:
                time.sleep(self.QUEUED_S)
        return self._target.forward_many(passes)


def test_a_stream_waiting_behind_other_sessions_keeps_its_session(own_llamacpp_target, close_draft):
    """Mid-stream, one step comes 3 s late (queued behind others' work) to a client with a 1 s stall
    timeout; the service answers pings meanwhile, so the client waits on the same session and gets the
    target's tokens. (It gave up after 2 s, the stall timeout and a step's allowance, and reconnected,
    leaving its old session queued: with sixteen default-pair clients at once, each reconnect made the
    queue longer, and the service grew to 23 GB until the kernel killed it.)"""
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.verify_client import VerifyClient
    from tests.local_draft.test_fallback import target_alone

    prompt = close_draft.tokenize("def quicksort(arr):")
    expected = target_alone(own_llamacpp_target, prompt, 12)
    queued = QueuedStepTarget(own_llamacpp_target)
    running = RunningService(queued)
    queued.armed = True
    try:
        client = VerifyClient(running.url, hello_for(close_draft), stall_timeout_s=1.0)
        try:
            started = time.monotonic()
            result = ServerOnlyGenerator(client, close_draft.end_ids).generate(prompt, 12)
            took = time.monotonic() - started
        finally:
            client.close()
    finally:
        running.close()
    assert queued.passes > QueuedStepTarget.STEP_AT and took >= QueuedStepTarget.QUEUED_S
    assert result.token_ids == expected
