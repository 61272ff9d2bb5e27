"""`specwire api` through real clients: the openai package, the llm command line, and plain HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import openai
import pytest

from tests.app.api.conftest import start_endpoint

QUICKSORT = [{"role": "user", "content": "def quicksort(arr):"}]


def client(endpoint, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint.url, api_key=api_key, max_retries=0, timeout=120)


def post(url: str, body, token: str | None = None) -> tuple[int, dict | str]:
    """POST JSON (or raw bytes) with urllib; the status and the decoded answer (an event stream as text)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            status = response.status
            kind = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        text, status, kind = exc.read().decode(), exc.code, exc.headers.get("Content-Type", "")
    return status, (json.loads(text) if kind.startswith("application/json") else text)


# ---- the openai package -------------------------------------------------------------

def test_greedy_chat_is_token_identical_to_generate_in_server_mode(endpoint, chat_prompt, reference):
    """A greedy chat completion: the tokens and text of `specwire generate --mode server` on the template's text."""
    answer = client(endpoint).chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=40,
                                                      temperature=0)
    expected = reference(chat_prompt(QUICKSORT), 40)
    provenance = answer.model_extra["specwire"]
    assert provenance["token_ids"] == expected["token_ids"]
    assert answer.choices[0].message.content == expected["text"]
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 40
    assert answer.usage.prompt_tokens == expected["prompt_tokens"]
    assert provenance["mode"] == "hybrid" and provenance["verified"] and provenance["unverified_tokens"] == 0
    # what speculation did, counted consistently: every kept guess was drafted and saved a pass. Whether
    # the drafter guesses at all is the controller's call from this machine's speed (a loaded machine
    # rests it), so it is asserted where the device is paced for it (test_stream_speculator.py)
    assert 0 <= provenance["accepted"] <= provenance["drafted"]
    # a pass commits its kept guesses and, within max_tokens, its own token
    assert provenance["target_passes"] <= 40 <= provenance["target_passes"] + provenance["accepted"], provenance


def test_a_stream_sends_the_same_text_then_finish_usage_and_provenance(endpoint, chat_prompt, reference):
    """Streaming with include_usage: role first, text deltas, a finish chunk with provenance, a usage chunk."""
    chunks = list(client(endpoint).chat.completions.create(
        model="specwire", messages=QUICKSORT, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    expected = reference(chat_prompt(QUICKSORT), 40)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["text"]
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert finish[0].model_extra["specwire"]["token_ids"] == expected["token_ids"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert all(c.usage is None for c in chunks[:-1])


def test_text_completions_stream_and_not_continue_the_prompt_as_generate_does(endpoint, reference):
    """/v1/completions: the raw prompt, tokenized as `specwire generate` tokenizes it, streamed or whole."""
    expected = reference("def fibonacci(n):", 30)
    whole = client(endpoint).completions.create(model="specwire", prompt="def fibonacci(n):", max_tokens=30,
                                                temperature=0)
    streamed = client(endpoint).completions.create(model="specwire", prompt="def fibonacci(n):", max_tokens=30,
                                                   temperature=0, stream=True)
    assert whole.choices[0].text == expected["text"] and whole.model_extra["specwire"]["token_ids"] == \
        expected["token_ids"]
    assert "".join(c.choices[0].text for c in streamed) == expected["text"]
    assert whole.usage.prompt_tokens == expected["prompt_tokens"] and whole.choices[0].finish_reason == "length"


def test_a_stop_split_across_tokens_cuts_before_it_streamed_or_not(endpoint, chat_prompt, reference, close_draft):
    """A stop string made of the end of one token and the start of the next: the text before its first
    occurrence, finish_reason stop, the same whether streamed or not."""
    expected = reference(chat_prompt(QUICKSORT), 40)
    pieces = [close_draft.token_bytes(t).decode("utf-8", "replace") for t in expected["token_ids"]]

    def split_stop(i: int) -> str | None:
        """The stop made of token i's last character and token i+1's first, if that is where it first occurs."""
        if not pieces[i] or not pieces[i + 1] or "\ufffd" in pieces[i] + pieces[i + 1]:
            return None
        stop = pieces[i][-1] + pieces[i + 1][0]
        return stop if expected["text"].find(stop) == len("".join(pieces[: i + 1])) - 1 else None

    stop = next(stop for i in range(5, len(pieces) - 1) if (stop := split_stop(i)))
    cut = expected["text"][: expected["text"].find(stop)]
    api = client(endpoint)
    whole = api.chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=40, temperature=0,
                                        stop=[stop, "never appears in this text \u2603"])
    streamed = list(api.chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=40, temperature=0,
                                                stop=stop, stream=True))
    assert whole.choices[0].message.content == cut and whole.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == cut
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "stop"
    assert whole.usage.completion_tokens < 40


def test_refusals_come_in_openais_error_shape_naming_the_field(endpoint):
    """Legacy functions, n > 1, a penalty, an image part and a function message are 400s naming the field; an
    unknown model is a 404."""
    api = client(endpoint)
    cases = {
        "functions": dict(functions=[{"name": "f", "parameters": {}}]),
        "n": dict(n=2),
        "frequency_penalty": dict(frequency_penalty=0.5),
        "messages[0].content[1]": dict(messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
        "messages[1].role": dict(messages=[*QUICKSORT, {"role": "function", "content": "42", "name": "f"}]),
    }
    for field, extra in cases.items():
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(**{"model": "specwire", "messages": QUICKSORT, "max_tokens": 4, **extra})
        assert refused.value.status_code == 400 and refused.value.body["param"] == field, field
        assert field.split("[")[0] in refused.value.body["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        api.chat.completions.create(model="gpt-4o", messages=QUICKSORT, max_tokens=4)
    assert missing.value.body["code"] == "model_not_found" and "specwire" in missing.value.body["message"]


def test_content_as_text_parts_and_neutral_fields_are_accepted(endpoint, chat_prompt, reference):
    """Content as a list of text parts, tools: [] and n: 1 generate as the plain request; unknown fields are
    ignored and named in the response."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "def quicksort(arr):"}]}]
    answer = client(endpoint).chat.completions.create(
        model="specwire", messages=parts, max_tokens=12, temperature=0, n=1, tools=[], frequency_penalty=0,
        user="someone", extra_body={"cache_prompt": True})
    assert answer.choices[0].message.content == reference(chat_prompt(QUICKSORT), 12)["text"]
    assert answer.model_extra["specwire"]["ignored"] == ["cache_prompt", "user"]


def test_models_are_listed_and_retrieved(endpoint):
    """GET /v1/models lists the one model, GET /v1/models/{id} finds it and nothing else."""
    api = client(endpoint)
    assert [m.id for m in api.models.list().data] == ["specwire"]
    assert api.models.retrieve("specwire").id == "specwire"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4o")


def test_the_seed_keys_the_services_draws(tiny, tiny_service):
    """With --k 0 (the service samples every token) a request's seed decides its sampled text: the same seed
    twice gives one text, another seed another (with drafting, rounds follow timings: see docs/openai-api.md)."""
    k0 = start_endpoint(tiny.draft, "--server", tiny_service, "--k", "0")
    try:
        api = client(k0)

        def sampled(seed: int) -> str:
            return api.chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=24, temperature=1.0,
                                               top_p=0.9, seed=seed).choices[0].message.content

        first = sampled(7)
        assert sampled(7) == first and sampled(8) != first
    finally:
        k0.stop()


def test_a_request_takes_the_session_opened_ahead_for_its_settings(endpoint):
    """After a greedy request the next greedy one starts on a session opened ahead (no handshake to wait
    for); a seeded one, or one with other settings, opens its own."""
    api = client(endpoint)

    def session(**settings) -> str:
        answer = api.chat.completions.create(model="specwire", messages=QUICKSORT, max_tokens=4, **settings)
        return answer.model_extra["specwire"]["notes"][0]

    session(temperature=0)
    assert session(temperature=0) == "session opened ahead"
    assert session(temperature=0, seed=5) == "session opened for the request"
    assert session(temperature=0.7) == "session opened for the request"
    assert session(temperature=0.7) == "session opened ahead"


# ---- plain HTTP -----------------------------------------------------------------------

def test_plain_http_events_end_with_done_and_bad_bodies_get_clear_400s(endpoint):
    """An event stream is `data: {json}` lines ending in `data: [DONE]`; malformed or oversized requests are
    400s that say what was wrong."""
    url = endpoint.url + "/chat/completions"
    status, stream = post(url, {"model": "specwire", "messages": QUICKSORT, "max_tokens": 6, "temperature": 0,
                                "stream": True})
    events = [line.removeprefix("data: ") for line in stream.split("\n\n") if line]
    assert status == 200 and events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])
    for body, field, words in [
        (b"{not json", None, "not valid JSON"),
        ({"model": "specwire"}, "messages", "`messages` is required"),
        ({"model": "specwire", "messages": QUICKSORT, "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"model": "specwire", "messages": QUICKSORT, "temperature": 3}, "temperature", "between 0 and 2"),
        ({"model": "specwire", "messages": QUICKSORT, "stop": [""]}, "stop", "must not be empty"),
        ({"model": "specwire", "messages": QUICKSORT, "stream_options": {"include_usage": True}}, "stream_options",
         "only allowed when `stream` is true"),
        ({"model": "specwire", "messages": [{"role": "user", "content": "x " * 5000}]}, "messages",
         "context is"),
    ]:
        status, answer = post(url, body)
        assert status == 400, (body, answer)
        assert answer["error"]["param"] == field and words in answer["error"]["message"], answer
        assert answer["error"]["type"] == "invalid_request_error"
    status, answer = post(endpoint.url + "/embeddings", {"model": "specwire", "input": "x"})
    assert status == 404 and "/v1/chat/completions" in answer["error"]["message"]


def test_with_a_token_file_only_requests_bearing_the_token_are_served(tiny, tiny_service, tmp_path):
    """--api-token-file: no token or a wrong one is a 401 in OpenAI's shape; the openai package's api_key passes."""
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    token_file.chmod(0o600)
    guarded = start_endpoint(tiny.draft, "--server", tiny_service, "--api-token-file", str(token_file))
    try:
        body = {"model": "specwire", "messages": QUICKSORT, "max_tokens": 4, "temperature": 0}
        for token in (None, "wrong"):
            status, answer = post(guarded.url + "/chat/completions", body, token)
            assert status == 401 and answer["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client(guarded, api_key="wrong").models.list()
        answer = client(guarded, api_key="s3cret").chat.completions.create(**body)
        assert answer.usage.completion_tokens == 4
    finally:
        guarded.stop()


# ---- the llm command line --------------------------------------------------------------

def test_the_llm_command_line_prints_the_reference_streamed_and_not(endpoint, chat_prompt, reference, tmp_path):
    """`llm -m specwire` configured through extra-openai-models.yaml prints the greedy reference text."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: specwire\n  model_name: specwire\n  api_base: \"{endpoint.url}\"\n")
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path)}
    expected = reference(chat_prompt(QUICKSORT), 16)["text"]
    for stream_flag in ([], ["--no-stream"]):
        done = subprocess.run([sys.executable, "-m", "llm", "prompt", "-m", "specwire", "-o", "temperature", "0",
                               "-o", "max_tokens", "16", *stream_flag, "def quicksort(arr):"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout == expected + "\n", stream_flag
