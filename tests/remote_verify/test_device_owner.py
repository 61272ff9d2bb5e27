"""A loaded target is served by one service at a time: a second is refused, never a crash."""

from __future__ import annotations

import threading

import pytest

from benchmarks.emulation.profiles import TargetProfile
from benchmarks.emulation.target import EmulatedTarget
from local_draft.draft_model import DraftModel
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from remote_verify.server import TargetLoadError
from wire.protocol import SamplingParams
from tests.conftest import RunningService, hello_for

PACED = TargetProfile(name="tests-owner", pass_points=((1, 2.0), (64, 2.2)))


def test_a_second_service_on_a_served_backend_is_refused_with_what_to_do(new_llamacpp_target):
    """Directly or through the emulated device's wrapper, a backend another service serves is
    refused while that service runs, saying why and what to do; once it stops, it may be served."""
    backend = new_llamacpp_target()
    first = RunningService(backend)
    try:
        for second in (backend, EmulatedTarget(backend, PACED)):
            with pytest.raises(TargetLoadError) as refused:
                RunningService(second)
            assert "already served by another service" in str(refused.value)
            assert "load the model again" in str(refused.value)
    finally:
        first.close()
    again = RunningService(EmulatedTarget(backend, PACED))
    again.close()


STREAM_ROUNDS = 8


def test_services_started_and_stopped_in_a_loop_each_on_its_own_backend_stream_without_a_crash(
        new_llamacpp_target, close_draft, tiny):
    """As the tests and the emulated services do in one process: a plain and a paced service,
    each over a backend of its own, started, streaming at once, and stopped, round after round;
    every stream is the target's text."""
    drafters = [close_draft, DraftModel(tiny.draft, n_ctx=1024, n_threads=1)]  # a drafter per stream thread
    prompt = close_draft.tokenize("def quicksort(arr):")
    texts: list[list[int]] = []
    problems: list[BaseException] = []

    def stream(url: str, draft: DraftModel) -> None:
        try:
            client = VerifyClient(url, hello_for(draft))
            texts.append(StreamSpeculator(draft, client, SamplingParams(), colocated=False)
                         .generate(prompt, 16).token_ids)
            client.close()
        except BaseException as exc:
            problems.append(exc)

    for _ in range(STREAM_ROUNDS):
        plain = RunningService(new_llamacpp_target())
        paced = RunningService(EmulatedTarget(new_llamacpp_target(), PACED))
        beside = threading.Thread(target=stream, args=(plain.url, drafters[1]))
        beside.start()
        stream(paced.url, drafters[0])  # the two services' device threads run at once
        beside.join(60)
        plain.close()
        paced.close()
    assert not problems, problems
    assert len(texts) == 2 * STREAM_ROUNDS and all(text == texts[0] for text in texts)
