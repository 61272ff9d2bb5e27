"""A lost service: a stream goes on offline and says so; a request with no service runs offline, marked."""

from __future__ import annotations

import signal

import openai

from tests.app.api.conftest import generate_reference, start_endpoint, start_service

QUICKSORT = [{"role": "user", "content": "def quicksort(arr):"}]


def test_a_service_killed_mid_stream_is_continued_offline_and_the_reply_says_so(tiny, chat_prompt):
    """SIGKILL the service after the first text: the stream still ends normally; its provenance marks the
    offline tokens, says it is not verified, and notes the loss; the verified part is the target's. The
    next request, with no service to reach, runs offline from its first token."""
    process, url = start_service(tiny.target_gguf)
    endpoint = start_endpoint(tiny.draft, "--server", url)
    try:
        expected = generate_reference(tiny.draft, url, chat_prompt(QUICKSORT), 200)["token_ids"]
        api = openai.OpenAI(base_url=endpoint.url, api_key="unused", max_retries=0, timeout=120)
        chunks = []
        for chunk in api.chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=200,
                                                 temperature=0, stream=True):
            chunks.append(chunk)
            if len(chunks) == 2:  # the first text is out: the service goes
                process.send_signal(signal.SIGKILL)
                process.wait()
        provenance = chunks[-1].model_extra["specwire"]
        assert chunks[-1].choices[0].finish_reason == "length" and len(provenance["token_ids"]) == 200
        assert not provenance["verified"] and provenance["unverified_tokens"] > 0
        assert provenance["provenance"][-1][0] == "offline"
        assert any("lost the service" in note for note in provenance["notes"])
        marks = [mark for mark, _ in provenance["provenance"]]
        assert marks.index("offline") == len(marks) - 1  # verified, then offline to the end
        verified = 200 - provenance["unverified_tokens"]
        assert verified > 0 and provenance["token_ids"][:verified] == expected[:verified]

        after = api.chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=20, temperature=0)
        offline = after.model_extra["specwire"]
        assert offline["mode"] == "offline" and offline["provenance"] == [["offline", 20]]
        assert not offline["verified"] and "unreachable" in offline["notes"][0]
    finally:
        endpoint.stop()
        process.kill()
        process.wait()


def test_a_request_drafted_by_ngram_that_loses_the_service_goes_on_with_the_drafter_once_free(tiny):
    """While a stream holds the one drafter, a second request drafts by n-gram; the service is killed: the
    second waits a few seconds for it, then for the drafter (freed when the first client hangs up), and ends
    its reply offline, marked, instead of failing."""
    process, url = start_service(tiny.target_gguf)
    endpoint = start_endpoint(tiny.draft, "--server", url)
    try:
        api = openai.OpenAI(base_url=endpoint.url, api_key="unused", max_retries=0, timeout=120)
        holder = api.chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=3000, temperature=0,
                                             stream=True)
        held = iter(holder)
        next(held), next(held)  # its text flows: it holds the drafter
        second = iter(api.chat.completions.create(
            model="specwire", messages=[{"role": "user", "content": "class Stack:"}], max_tokens=300,
            temperature=0, stream=True))
        chunks = [next(second), next(second)]
        process.send_signal(signal.SIGKILL)
        process.wait()
        holder.close()  # the drafter is free again
        chunks += list(second)
        provenance = chunks[-1].model_extra["specwire"]
        assert chunks[-1].choices[0].finish_reason == "length" and len(provenance["token_ids"]) == 300
        assert provenance["mode"] == "hybrid" and not provenance["verified"]
        assert any("going on with the draft model" in note for note in provenance["notes"])
        marks = [mark for mark, _ in provenance["provenance"]]
        assert marks[-1] == "offline" and marks.index("offline") == len(marks) - 1
    finally:
        endpoint.stop()
        process.kill()
        process.wait()
