"""Several clients at once: each exact, a busy drafter's overflow drafted by n-gram, a hang-up cancels."""

from __future__ import annotations

import threading
import time

import openai

from tests.app.api.conftest import service_metric

SPARE = 1  # the session the endpoint keeps open for the next request (app/api/sessions.py)
PROMPTS = ["def quicksort(arr):", "Write a haiku about rain.", "SELECT name FROM users WHERE", "class Stack:"]


def client(endpoint, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint.url, api_key="unused", max_retries=0, timeout=timeout)


def messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_four_concurrent_streaming_clients_all_finish_each_equal_to_its_reference(endpoint, chat_prompt, reference):
    """Four streams started together: each text and token list is `generate --mode server`'s for its prompt."""
    start = threading.Barrier(len(PROMPTS))
    results: dict[str, tuple[str, dict]] = {}

    def stream(prompt: str) -> None:
        start.wait()
        chunks = list(client(endpoint).chat.completions.create(
            model="specwire", messages=messages(prompt), max_tokens=160, temperature=0, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        results[prompt] = text, chunks[-1].model_extra["specwire"]

    threads = [threading.Thread(target=stream, args=(p,)) for p in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert sorted(results) == sorted(PROMPTS)
    for prompt, (text, provenance) in results.items():
        expected = reference(chat_prompt(messages(prompt)), 160)
        assert provenance["token_ids"] == expected["token_ids"] and text == expected["text"], prompt
        assert provenance["verified"] and provenance["mode"] in ("hybrid", "ngram")


def test_a_request_that_finds_the_drafter_lent_drafts_by_ngram_and_stays_exact(endpoint, chat_prompt, reference):
    """While a long stream holds the one drafter, another request is drafted by n-gram, verified, and exact."""
    api = client(endpoint)
    holder = api.chat.completions.create(model="specwire", messages=messages(PROMPTS[0]), max_tokens=3000,
                                         temperature=0, stream=True)
    try:
        next(iter(holder))  # the role chunk: its generation runs, and holds the drafter
        answer = api.chat.completions.create(model="specwire", messages=messages(PROMPTS[1]), max_tokens=60,
                                             temperature=0)
    finally:
        holder.close()
    provenance = answer.model_extra["specwire"]
    assert provenance["mode"] == "ngram" and provenance["verified"]
    assert provenance["token_ids"] == reference(chat_prompt(messages(PROMPTS[1])), 60)["token_ids"]


def test_a_client_that_hangs_up_mid_stream_stops_its_generation_and_its_service_session(endpoint, tiny_service):
    """Closing a 3000-token stream after a few chunks: its service session closes (the spare stays) and the
    service's rounds stop."""
    rounds_before = service_metric(tiny_service, "specwire_rounds_total")
    stream = client(endpoint).chat.completions.create(model="specwire", messages=messages(PROMPTS[2]),
                                                      max_tokens=3000, temperature=0, stream=True)
    chunks = iter(stream)
    for _ in range(4):
        next(chunks)
    stream.close()
    assert wait_until(lambda: service_metric(tiny_service, "specwire_sessions_open") <= SPARE), \
        "the request's session with the service stayed open"
    rounds_after = service_metric(tiny_service, "specwire_rounds_total")
    time.sleep(1.0)
    assert service_metric(tiny_service, "specwire_rounds_total") == rounds_after
    assert rounds_after - rounds_before < 300  # far from the thousand rounds 3000 tokens take


def test_a_client_that_times_out_on_a_whole_response_stops_its_generation(endpoint, tiny_service):
    """A non-streaming request abandoned by its client (a timeout) is stopped too, not run to its end."""
    rounds_before = service_metric(tiny_service, "specwire_rounds_total")
    try:
        client(endpoint, timeout=0.5).chat.completions.create(model="specwire", messages=messages(PROMPTS[3]),
                                                              max_tokens=3000, temperature=0)
        raise AssertionError("3000 tokens came back within half a second")
    except openai.APITimeoutError:
        pass
    assert wait_until(lambda: service_metric(tiny_service, "specwire_sessions_open") <= SPARE)
    rounds_after = service_metric(tiny_service, "specwire_rounds_total")
    time.sleep(1.0)
    assert service_metric(tiny_service, "specwire_rounds_total") == rounds_after
    assert rounds_after - rounds_before < 300
