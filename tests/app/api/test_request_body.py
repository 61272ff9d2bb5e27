"""Request bodies: every field supported, refused with a 400 naming it, or ignored and said to be."""

from __future__ import annotations

import pytest

from app.api.errors import ApiError
from app.api.request_body import REFUSED, SUPPORTED, parse_request
from local_draft.chat_template import Message

CHAT = {"model": "specwire", "messages": [{"role": "user", "content": "hi"}]}


def refusal(kind: str, body: dict) -> ApiError:
    with pytest.raises(ApiError) as refused:
        parse_request(kind, body)
    return refused.value


def test_the_supported_fields_are_read():
    """Sampling, seed, the token budget, stops, streaming with usage, messages in every accepted form."""
    request = parse_request("chat", {
        "model": "specwire", "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 3, "max_completion_tokens": 9,
        "stop": "\n\n", "stream": True, "stream_options": {"include_usage": True}, "n": 1, "messages": [
            {"role": "developer", "content": "be brief"}, {"role": "user", "content": [
                {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": None}]})
    assert (request.params.temperature, request.params.top_p, request.params.top_k) == (0.5, 0.9, 40)
    assert (request.seed, request.max_tokens, request.stops, request.stream, request.include_usage) == \
        (3, 9, ("\n\n",), True, True)
    assert request.messages == (Message("system", "be brief"), Message("user", "one\ntwo"), Message("assistant", ""))
    assert request.ignored == ()


def test_openais_defaults_apply_when_fields_are_left_out():
    """No temperature samples at 1, as OpenAI does; no max_tokens runs to the context's end."""
    request = parse_request("chat", CHAT)
    assert request.params.temperature == 1.0 and request.max_tokens is None and not request.stream


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_each_refused_field_is_a_400_naming_it_and_its_neutral_value_passes(kind):
    """Every refused field, sent with a value that would change the output, is refused by name."""
    base = CHAT if kind == "chat" else {"model": "specwire", "prompt": "x"}
    changing = {"tools": [{"type": "function"}], "tool_choice": "required", "functions": [{"name": "f"}],
                "function_call": {"name": "f"}, "logprobs": True if kind == "chat" else 1, "top_logprobs": 2,
                "audio": {"voice": "x"}, "modalities": ["audio"],
                "prediction": {"type": "content"}, "web_search_options": {}, "reasoning_effort": "low",
                "echo": True, "suffix": "}", "best_of": 2, "frequency_penalty": 0.5, "presence_penalty": -1,
                "logit_bias": {"1": 5}, "min_p": 0.1, "typical_p": 0.5, "repetition_penalty": 1.1,
                "ignore_eos": True, "min_tokens": 5, "stop_token_ids": [2], "grammar": "root ::= x",
                "guided_json": {}, "guided_regex": "x", "guided_choice": ["a"], "guided_grammar": "g", "mirostat": 2}
    assert set(REFUSED[kind]) <= set(changing)
    for name in REFUSED[kind]:
        error = refusal(kind, {**base, name: changing[name]})
        assert error.status == 400 and error.param == name and f"`{name}`" in error.message, name
    neutral = parse_request(kind, {**base, "n": 1, "frequency_penalty": 0, "logit_bias": {}, "best_of": 1,
                                   **({"tools": [], "tool_choice": "none", "logprobs": False,
                                       "response_format": {"type": "text"}} if kind == "chat" else {"echo": False})})
    assert neutral.ignored == ()


def test_unknown_and_bookkeeping_fields_are_ignored_by_name():
    """`user`, an unknown field and a message's `name` are listed as ignored, never silently dropped."""
    request = parse_request("chat", {**CHAT, "user": "u1", "cache_prompt": True,
                                     "messages": [{"role": "user", "content": "hi", "name": "ann"}]})
    assert request.ignored == ("cache_prompt", "user", "messages[0].name")


@pytest.mark.parametrize("body, param, words", [
    ({"model": "specwire", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n", "must be 1"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model", "`model` is required"),
    ({"model": "specwire", "messages": []}, "messages", "`messages` is required"),
    ({"model": "specwire", "messages": [{"role": "function", "content": "4"}]}, "messages[0].role",
     "legacy functions API"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "letters"),
    ({**CHAT, "tool_choice": "required"}, "tool_choice", "needs `tools`"),
    ({**CHAT, "top_logprobs": 2}, "top_logprobs", "needs `logprobs: true`"),
    ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "one of ['f']"),
    ({"model": "specwire", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]", "`image_url` parts are not supported"),
    ({"model": "specwire", "messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]},
     "messages[0].tool_calls", "tool_calls"),
    ({"model": "specwire", "messages": [{"role": "user", "content": None}]}, "messages[0].content", "string"),
    ({**CHAT, "max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", "differ"),
    ({**CHAT, "max_tokens": "5"}, "max_tokens", "whole number"),
    ({**CHAT, "temperature": 0.0001}, "temperature", "use 0 for greedy"),
    ({**CHAT, "top_p": 0}, "top_p", "(0, 1]"),
    ({**CHAT, "seed": -1}, "seed", "between 0 and 2**64 - 1"),
    ({**CHAT, "stop": ["a"] * 65}, "stop", "at most 64"),
    ({**CHAT, "stream": "yes"}, "stream", "true or false"),
])
def test_a_wrong_value_is_a_400_that_names_the_field_and_says_what_to_send(body, param, words):
    """Each mistake is refused with the field named and what is expected."""
    error = refusal("chat", body)
    assert error.status == 400 and error.param == param and words in error.message, error.message


def test_a_text_prompt_is_one_string_or_token_ids_never_a_batch():
    """`prompt`: a string, a list of one string, token ids; several prompts or an empty one are refused."""
    assert parse_request("text", {"model": "m", "prompt": ["abc"]}).prompt == "abc"
    assert parse_request("text", {"model": "m", "prompt": [1, 2, 3]}).prompt == (1, 2, 3)
    assert "one prompt a request" in refusal("text", {"model": "m", "prompt": ["a", "b"]}).message
    assert refusal("text", {"model": "m", "prompt": ""}).param == "prompt"
    assert "messages" not in SUPPORTED["text"] and "prompt" not in SUPPORTED["chat"]


@pytest.mark.parametrize("response_format, kind", [
    (None, None), ({"type": "text"}, None), ({"type": "json_object"}, "json_object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {"type": "object"}}},
     "json_schema"),
])
def test_response_format_becomes_the_requests_grammar(response_format, kind):
    """text or none: no grammar; json_object and json_schema: a grammar of that kind, the schema as compact JSON."""
    request = parse_request("chat", {**CHAT, **({"response_format": response_format} if response_format else {})})
    assert (request.grammar.kind if request.grammar else None) == kind
    if kind == "json_schema":
        assert request.grammar.schema == '{"type":"object"}'
