"""The default mode keeps what the round-based loop had: offline fallback, reconnects, stops, seeds,
n-gram guesses, and sessions that share the service's passes."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from local_draft.server_only import ServerOnlyGenerator
from local_draft.service_link import ServiceLink
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from wire.protocol import SamplingParams
from tests.conftest import hello_for
from tests.local_draft.test_fallback import FAST_BACKOFF, start_service, target_alone, wait_for

SAMPLED = SamplingParams(temperature=1.0, top_k=20)


@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_losing_the_service_mid_stream_goes_offline_then_a_restart_streams_again(tiny, llamacpp_target, close_draft,
                                                                                 stop_signal):
    """The service stopped after 20 tokens: offline tokens follow, marked; after a restart on the
    same port the stream resumes on a new session rebuilt from the history, and what it makes
    from there is the target's continuation of the text so far."""
    process, port = start_service(tiny.target_gguf)
    link = ServiceLink(f"ws://127.0.0.1:{port}", hello_for(close_draft), backoff=FAST_BACKOFF)
    made, marks, stopped = [], [], []

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        nonlocal process
        made.extend(tokens)
        marks.extend(provenance)
        if len(made) >= 20 and not stopped:
            process.send_signal(stop_signal)
            process.wait(timeout=60)
            stopped.append(len(made))
        if marks.count("offline") >= 5 and process.poll() is not None:
            process, _ = start_service(tiny.target_gguf, port)
            assert wait_for(lambda: link.current() is not None), "no reconnect"

    prompt = close_draft.tokenize("def quicksort(arr):")
    try:
        result = StreamSpeculator(close_draft, link, SamplingParams(), max_block=4).generate(prompt, 80, on_commit)
    finally:
        link.close()
        process.kill()
    assert len(result.token_ids) == 80 and result.stats.offline >= 5
    first_offline = marks.index("offline")
    resumed = first_offline + marks[first_offline:].index("target") if "target" in marks[first_offline:] else None
    assert first_offline >= 20 and resumed is not None, marks
    assert result.token_ids[:first_offline] == target_alone(llamacpp_target, prompt, first_offline)
    tail = target_alone(llamacpp_target, prompt + result.token_ids[:resumed], 80 - resumed)
    assert result.token_ids[resumed:] == tail  # verified again: the target's own continuation
    assert link.connections == 2


def test_a_seeded_sampled_stream_repeats_through_a_killed_and_restarted_service(tiny, close_draft):
    """Seed 7, sampling, guesses kept ahead: killed and replaced after 20 tokens (before the next
    pass, so nothing is made offline), the reply is the one made without the interruption."""
    def reply(restart_after: int | None) -> tuple[list[int], int]:
        process, port = start_service(tiny.target_gguf)
        link = ServiceLink(f"ws://127.0.0.1:{port}", hello_for(close_draft, SAMPLED, seed=7), backoff=FAST_BACKOFF)
        made: list[int] = []

        def on_commit(tokens: list[int], provenance: list[str]) -> None:
            nonlocal process
            made.extend(tokens)
            if restart_after is not None and len(made) >= restart_after and link.connections == 1:
                process.kill()
                process.wait()
                process, _ = start_service(tiny.target_gguf, port)
                assert wait_for(lambda: link.current() is not None and link.connections == 2), "no reconnect"

        try:
            result = StreamSpeculator(close_draft, link, SAMPLED, seed=7, max_block=3).generate(
                close_draft.tokenize("The"), 60, on_commit)
        finally:
            link.close()
            process.kill()
            process.wait()
        assert result.stats.offline == 0
        return result.token_ids, link.connections

    straight, _ = reply(None)
    interrupted, connections = reply(20)
    assert connections == 2 and interrupted == straight and len(straight) == 60


def test_a_stop_asked_mid_stream_cancels_it(paced_service, close_draft):
    """should_stop turning true after 10 tokens ends the reply with reason "stopped" within a few
    passes. The service is paced like a GPU (4 ms a pass): the tiny target alone passes a token in
    about a millisecond, faster than a Cancel crosses a busy machine, so a bound in tokens there
    would measure the machine's load, not the stop."""
    client = VerifyClient(paced_service.url, hello_for(close_draft))
    made = []
    asked_at = []

    def stop_after_ten() -> bool:
        if len(made) >= 10 and not asked_at:
            asked_at.append(time.perf_counter())
        return bool(asked_at)

    result = StreamSpeculator(close_draft, client, SamplingParams(), max_block=4).generate(
        close_draft.tokenize("Once upon a time"), 2000, lambda tokens, _: made.extend(tokens),
        should_stop=stop_after_ten)
    ended_in_s = time.perf_counter() - asked_at[0]
    client.close()
    assert result.stop_reason == "stopped" and 10 <= len(result.token_ids) < 10 + 40, len(result.token_ids)
    assert ended_in_s < 2.0, ended_in_s


def test_ngram_guesses_with_no_model_stream_the_targets_tokens(tiny, paced_service, close_draft):
    """--draft ngram in the default mode: no model runs, the context's copies are guessed and sent,
    and the text is the stream alone's."""
    url = paced_service.url
    prompt = close_draft.tokenize("a b c d a b c d a b c d a b c d a b")
    alone = ServerOnlyGenerator(VerifyClient(url, hello_for(close_draft)), close_draft.end_ids).generate(prompt, 40)
    client = VerifyClient(url, hello_for(close_draft))
    result = StreamSpeculator(None, client, SamplingParams(), drafting="ngram", max_block=8,
                              end_ids=close_draft.end_ids).generate(prompt, 40)
    client.close()
    assert result.token_ids == alone.token_ids
    assert result.stats.ahead_drafted > 0


def test_mixed_guesses_stream_the_targets_tokens(paced_service, close_draft):
    """--mix-ngram in the default mode: the model's and the copy's guesses, the stream alone's text."""
    url = paced_service.url
    prompt = close_draft.tokenize("def f(x):\n    return x\ndef f(x):\n    return x\ndef f(")
    alone = ServerOnlyGenerator(VerifyClient(url, hello_for(close_draft)), close_draft.end_ids).generate(prompt, 40)
    client = VerifyClient(url, hello_for(close_draft))
    result = StreamSpeculator(close_draft, client, SamplingParams(), drafting="mixed", max_block=6).generate(prompt, 40)
    client.close()
    assert result.token_ids == alone.token_ids and result.stats.accepted > 0


def test_streams_of_several_sessions_share_passes_and_each_is_exact(service_on, close_draft, tiny):
    """Six sessions streaming with guesses at once: every reply is its prompt's server-only
    reply, and the service ran some passes for more than one session."""
    from local_draft.draft_model import DraftModel

    service = service_on("llamacpp")
    prompts = ["def quicksort(arr):", "The quick brown fox", "import numpy", "Once upon", "class A:", "x = ["]
    expected = {}
    reference = ServerOnlyGenerator(VerifyClient(service.url, hello_for(close_draft)), close_draft.end_ids)
    for prompt in prompts:
        expected[prompt] = reference.generate(close_draft.tokenize(prompt), 60).token_ids
    drafts = [DraftModel(tiny.draft, n_ctx=512, n_threads=1) for _ in prompts]
    before = service.service.queue.passes, service.service.queue.shared_items
    results: dict[str, list[int]] = {}

    def run(prompt: str, draft) -> None:
        client = VerifyClient(service.url, hello_for(draft))
        results[prompt] = StreamSpeculator(draft, client, SamplingParams(), max_block=4).generate(
            draft.tokenize(prompt), 60).token_ids
        client.close()

    threads = [threading.Thread(target=run, args=(p, d)) for p, d in zip(prompts, drafts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == expected
    passes = service.service.queue.passes - before[0]
    members = service.service.queue.shared_items - before[1]
    assert members > passes  # some passes served more than one session


def test_a_service_that_lost_track_of_the_stream_gets_one_sync_then_the_error(close_draft):
    """A service that answers a stream's Generate with stale_state (it lost the session's history) is
    given the history by one Sync and asked again, once; refused again, the reply ends with that
    error. (A fake service, tests/fake_service.py: a real one answers the Generate after the Sync.)
    Before, the client asked again without a Sync, forever: a chat's reply hung."""
    from local_draft.verify_client import VerifyError
    from tests.fake_service import FakeService, honest_answer
    from wire.protocol import Error, Generate

    asked = []

    def answer(message, state):
        if isinstance(message, Generate):
            asked.append(message)
            fatal = len(asked) >= 50  # ends the old loop, so that the count below can say how far it went
            return [Error("stale_state", "this session's history is not the one you sent", seq=message.seq,
                          fatal=fatal)]
        return honest_answer()(message, state)

    fake = FakeService(answer)
    client = VerifyClient(fake.url, hello_for(close_draft))
    try:
        streamed = StreamSpeculator(close_draft, client, SamplingParams(), max_block=2, colocated=False)
        with pytest.raises(VerifyError) as error:
            streamed.generate(close_draft.tokenize("def f(x):"), 8)
        assert error.value.code == "stale_state"
        assert len(asked) == 2, len(asked)
        assert streamed.stats.syncs >= 1
    finally:
        client.close()
        fake.close()
