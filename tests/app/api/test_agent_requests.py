"""What agents send, through real clients: `response_format` (the constrained target's reply, exactly, and it
parses), `tools` (a call round trip), `logprobs` (the target alone's)."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import numpy as np
import openai
import pydantic
import pytest

from tests.app.api.test_endpoint import client
from tests.local_draft.test_stream_logprobs import target_logprobs

MESSAGES = [{"role": "user", "content": "Is this code? Reply in JSON."}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["self", "def", "return"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["ok", "kind", "n"], "additionalProperties": False}
MAX_TOKENS = 60


class Verdict(pydantic.BaseModel):
    ok: bool
    kind: Literal["self", "def", "return"]


@pytest.fixture(scope="module")
def constrained_alone(tiny, tiny_service, chat_prompt):
    """constrained_alone(messages, schema): the target alone under the schema (`--mode server` with it)."""
    from app.chat.reply import PromptTokens
    from local_draft.chat_template import template_for
    from local_draft.draft_model import DraftModel
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.verify_client import VerifyClient
    from wire.protocol import Grammar, SamplingParams

    tokenizer = DraftModel(tiny.draft, vocab_only=True)
    template = template_for(tokenizer.chat_template, tokenizer.token_text(tokenizer.bos_id).decode(),
                            tokenizer.token_text(tokenizer.eos_id).decode())
    verify = VerifyClient(tiny_service, tokenizer.hello(SamplingParams(), client="tests"))

    def run(messages, schema: dict) -> list[int]:
        generator = ServerOnlyGenerator(verify, tokenizer.end_ids, grammar=Grammar("json_schema", json.dumps(schema)))
        prompt = PromptTokens(tokenizer, template).of(chat_prompt(messages))
        return generator.generate(prompt, MAX_TOKENS).token_ids

    yield run
    verify.close()


def test_a_json_schema_reply_is_the_constrained_target_alone_and_valid(endpoint, constrained_alone):
    """Greedy, strict json_schema: the tokens of the target alone under the schema (however many guesses were kept:
    that depends on timing); it validates."""
    answer = client(endpoint).chat.completions.create(
        model="specwire", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}})
    provenance = answer.model_extra["specwire"]
    assert provenance["token_ids"] == constrained_alone(MESSAGES, SCHEMA)
    assert answer.choices[0].finish_reason == "stop" and provenance["verified"]
    jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMA)


def test_structured_outputs_parse_into_a_pydantic_model_streamed_or_not(endpoint):
    """`parse` with a Pydantic model gives an instance; streamed, the model's strict schema gives valid text too."""
    api = client(endpoint)
    parsed = api.beta.chat.completions.parse(model="specwire", messages=MESSAGES, response_format=Verdict,
                                             temperature=0, max_tokens=MAX_TOKENS)
    assert isinstance(parsed.choices[0].message.parsed, Verdict)
    streamed = api.chat.completions.create(
        model="specwire", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "Verdict", "strict": True,
                                                                "schema": {**Verdict.model_json_schema(),
                                                                           "additionalProperties": False}}})
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert Verdict.model_validate_json(text)


def test_json_object_mode_replies_with_an_object(endpoint):
    """json_object: the reply opens an object; sampled, it is still JSON wherever it ends complete."""
    answer = client(endpoint).chat.completions.create(model="specwire", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                      temperature=0.7, seed=3, response_format={"type": "json_object"})
    text = answer.choices[0].message.content
    assert text.startswith("{")
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("response_format, words", [
    ({"type": "xml"}, "must be text, json_object or json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "must be an object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5,
                                                                     "maximum": 1}}}, "cannot be compiled"),
])
def test_a_response_format_that_cannot_apply_is_a_400(endpoint, response_format, words):
    """A malformed or unsatisfiable response_format is refused by name, before anything is generated."""
    with pytest.raises(openai.BadRequestError) as refused:
        client(endpoint).chat.completions.create(model="specwire", messages=MESSAGES, max_tokens=4,
                                                 response_format=response_format)
    assert refused.value.body["param"].startswith("response_format") and words in refused.value.body["message"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"],
                   "additionalProperties": False}}}


def test_a_tool_call_round_trip(endpoint):
    """tool_choice required: a call to the tool with arguments valid under its parameters, streamed or not;
    the call and its result sent back are rendered into the next prompt, which is answered with text."""
    api = client(endpoint)
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    answer = api.chat.completions.create(model="specwire", messages=asked, tools=[WEATHER], tool_choice="required",
                                         temperature=0, max_tokens=MAX_TOKENS)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    streamed = list(api.chat.completions.create(model="specwire", messages=asked, tools=[WEATHER],
                                                tool_choice="required", temperature=0, max_tokens=MAX_TOKENS,
                                                stream=True))
    deltas = [d for c in streamed if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [(call.function.name, call.function.arguments)]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    back = [*asked, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "{\"celsius\": 4}"}]
    reply = api.chat.completions.create(model="specwire", messages=back, tools=[WEATHER], tool_choice="none",
                                        temperature=0, max_tokens=8)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.choices[0].message.tool_calls is None
    assert reply.usage.prompt_tokens > answer.usage.prompt_tokens  # the call and its result are in the prompt
    auto = dict(model="specwire", messages=back, tools=[WEATHER], temperature=0, max_tokens=8)
    whole = api.chat.completions.create(**auto).choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in api.chat.completions.create(**auto, stream=True)
                   if c.choices) == whole  # auto, no call made: the text streams as without tools


def test_the_llm_command_line_with_a_schema_prints_valid_json(endpoint, tmp_path):
    """`llm --schema` against a model configured with supports_schema: the reply validates against the schema."""
    import os
    import subprocess
    import sys

    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: specwire\n  model_name: specwire\n  api_base: \"{endpoint.url}\"\n  supports_schema: true\n")
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "llm", "prompt", "-m", "specwire", "-o", "temperature", "0",
                           "-o", "max_tokens", str(MAX_TOKENS), "--schema", json.dumps(SCHEMA), "Describe it."],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    jsonschema.validate(json.loads(done.stdout), SCHEMA)


# ---- log probabilities ----------------------------------------------------------------

LOGPROB_MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]
LOGPROB_TOKENS = 24


def test_chat_logprobs_are_the_target_alones_streamed_or_not(endpoint, tiny, llamacpp_target, chat_prompt):
    """Greedy: each token's logprob and its top 3 equal the target alone's within 1e-4; a stream sends the same."""
    from app.chat.reply import PromptTokens
    from local_draft.chat_template import template_for
    from local_draft.draft_model import DraftModel

    api = client(endpoint)
    answer = api.chat.completions.create(model="specwire", messages=LOGPROB_MESSAGES, max_tokens=LOGPROB_TOKENS,
                                         temperature=0,
                                         logprobs=True, top_logprobs=3)
    tokens = answer.model_extra["specwire"]["token_ids"]
    entries = answer.choices[0].logprobs.content
    tokenizer = DraftModel(tiny.draft, vocab_only=True)
    template = template_for(tokenizer.chat_template, tokenizer.token_text(tokenizer.bos_id).decode(),
                            tokenizer.token_text(tokenizer.eos_id).decode())
    prompt = PromptTokens(tokenizer, template).of(chat_prompt(LOGPROB_MESSAGES))
    expected = target_logprobs(llamacpp_target, prompt, tokens)
    texts = [t for t in tokens if t not in tokenizer.end_ids]
    assert len(entries) == len(texts)
    for token, entry, row in zip(texts, entries, expected):
        assert entry.token == tokenizer.token_bytes(token).decode("utf-8", "replace")
        assert abs(entry.logprob - row[token]) < 1e-4
        assert len(entry.top_logprobs) == 3
        assert np.allclose([t.logprob for t in entry.top_logprobs], np.sort(row)[::-1][:3], atol=1e-4)
    streamed = list(api.chat.completions.create(model="specwire", messages=LOGPROB_MESSAGES, max_tokens=LOGPROB_TOKENS,
                                                temperature=0, logprobs=True, top_logprobs=3, stream=True))
    streamed_entries = [entry for c in streamed if c.choices and c.choices[0].logprobs
                        for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed_entries] == [(e.token, e.logprob) for e in entries]


def test_completions_logprobs_come_in_the_legacy_shape(endpoint):
    """/v1/completions with logprobs 2: tokens, token_logprobs, top_logprobs (2 each) and text offsets."""
    answer = client(endpoint).completions.create(model="specwire", prompt="def add(a, b):", max_tokens=8,
                                                 temperature=0, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) and all(lp <= 0 for lp in logprobs.token_logprobs)
    # (the legacy shape keys alternatives by their text: two byte pieces that both show as "\ufffd" share one key)
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == list(np.cumsum([0] + [len(t) for t in logprobs.tokens[:-1]]))
