"""Under a grammar the default mode gives the constrained target's text exactly, and it parses."""

from __future__ import annotations

import json

import jsonschema
import msgspec
import numpy as np
import pytest

from local_draft.server_only import ServerOnlyGenerator
from local_draft.stream_speculator import GrammarUnsupported, StreamSpeculator
from local_draft.verify_client import VerifyClient
from wire import grammar as grammars
from wire.protocol import Grammar, SamplingParams
from wire.randomness import DecisionRandomness
from wire.sampling import race_choice, warp
from tests.conftest import hello_for

SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["self", "def", "return"]}},
     "required": ["ok", "kind"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "tags": {"type": "array", "items": {"enum": ["a", "the"]}, "maxItems": 3}},
     "required": ["n", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"x": {"type": "number",
                                                                                       "minimum": -5, "maximum": 5}},
                                                "required": ["x"], "additionalProperties": False},
                                      "word": {"type": "string", "pattern": "^[a-z]{1,6}$"}},
     "required": ["inner", "word"], "additionalProperties": False},
]


def closed(properties: dict, required: list[str] | None = None) -> dict:
    """An object schema with these properties, all required unless named, and no others."""
    return {"type": "object", "properties": properties, "required": required or list(properties),
            "additionalProperties": False}


# Twenty schemas: nested objects, enums, arrays, numbers, strings with patterns. Each is bounded
# (a random tiny model inside an unbounded string or a free decimal would write until max_tokens).
SCHEMA_SET = [
    closed({"ok": {"type": "boolean"}}),
    closed({"kind": {"enum": ["self", "def", "return"]}}),
    closed({"n": {"type": "integer", "minimum": 0, "maximum": 9}}),
    closed({"n": {"type": "integer", "minimum": -500, "maximum": 500}}),
    closed({"x": {"type": "number", "minimum": -5, "maximum": 5, "multipleOf": 0.5}}),
    closed({"word": {"type": "string", "pattern": "^[a-z]{1,8}$"}}),
    closed({"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}}),
    closed({"s": {"type": "string", "maxLength": 12}}),
    closed({"tags": {"type": "array", "items": {"enum": ["a", "the", "in"]}, "maxItems": 4}}),
    closed({"ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                    "minItems": 1, "maxItems": 5}}),
    closed({"flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2}}),
    closed({"inner": closed({"a": {"type": "boolean"}, "b": {"enum": [1, 2, 3]}})}),
    closed({"p": closed({"q": closed({"r": {"type": "integer", "minimum": 0, "maximum": 5}})})}),
    closed({"items": {"type": "array", "items": closed({"k": {"enum": ["x", "y"]}}), "maxItems": 3}}),
    closed({"a": {"type": "null"}, "b": {"type": "boolean"}}),
    closed({"v": {"anyOf": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 9}]}}),
    closed({"opt": {"type": "boolean"}, "req": {"enum": ["on", "off"]}}, ["req"]),
    closed({"name": {"type": "string", "pattern": "^[A-Z][a-z]{0,6}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 6},
    {"enum": ["self", "return", "def", "the"]},
]
PROMPTS = ["Reply in JSON:", "def f(x):"]
MAX_TOKENS = 60


def grammar_of(schema: dict) -> Grammar:
    return Grammar("json_schema", json.dumps(schema))


def constrained_target_alone(target, context: list[int], grammar: Grammar, end_ids, n: int,
                             params: SamplingParams = SamplingParams(), seed: int = 0) -> list[int]:
    """The target backend itself, one token at a time, its logits masked by the grammar before anything
    else: the argmax, or the race of the masked, warped distribution over the clocks of (seed, position)."""
    vocab = grammars.vocab_for(f"reference:{id(target)}", load=target.token_texts, n_vocab=target.vocab_size)
    constraint = grammars.TokenConstraint(grammar, vocab, end_ids)
    randomness = DecisionRandomness(seed)
    cache, tokens = target.new_cache(), []
    logits = target.forward(cache, context, 1)
    for _ in range(n):
        assert constraint.follow(tokens)
        masked = constraint.mask(logits[-1])
        if params.greedy:
            tokens.append(int(masked.argmax()))
        else:
            probs = warp(masked, params)
            tokens.append(race_choice(probs, randomness.race(len(context) + len(tokens), probs.shape[0])))
        if tokens[-1] in end_ids:
            break
        logits = target.forward(cache, tokens[-1:], 1)
    return tokens


def reply_json(draft, tokens: list[int]):
    text = b"".join(draft.token_bytes(t) for t in tokens if t not in draft.end_ids)
    return json.loads(text)


@pytest.mark.parametrize("schema", SCHEMAS, ids=["enum-bool", "int-array", "nested-pattern"])
def test_greedy_stream_with_a_schema_is_the_constrained_target_alone(service, target, close_draft, schema):
    """Each backend, three schemas: the stream (guesses and all) equals the masked target step by step, and parses."""
    end_ids = sorted(close_draft.end_ids)
    client = VerifyClient(service.url, hello_for(close_draft))
    assert "json_schema" in client.welcome.grammars
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=4, grammar=grammar_of(schema))
    server_only = ServerOnlyGenerator(client, end_ids, grammar=grammar_of(schema))
    for prompt in PROMPTS:
        context = close_draft.tokenize(prompt)
        made = speculator.generate(context, MAX_TOKENS).token_ids
        alone = constrained_target_alone(target, context, grammar_of(schema), end_ids, MAX_TOKENS)
        assert made == alone, prompt
        assert server_only.generate(context, MAX_TOKENS).token_ids == alone, prompt
        assert made[-1] in end_ids, "the value was completed and ended"
        jsonschema.validate(reply_json(close_draft, made), schema)
    client.close()


def test_twenty_schemas_greedy_are_the_constrained_target_alone_and_valid(service_on, llamacpp_target, close_draft):
    """Each of twenty schemas, two prompts: the default mode's reply equals the masked target's, ends, and validates."""
    end_ids = sorted(close_draft.end_ids)
    client = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    for schema in SCHEMA_SET:
        speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=4, grammar=grammar_of(schema))
        for prompt in PROMPTS:
            context = close_draft.tokenize(prompt)
            made = speculator.generate(context, 80).token_ids
            assert made == constrained_target_alone(llamacpp_target, context, grammar_of(schema), end_ids, 80)
            assert made[-1] in end_ids, (schema, prompt)
            jsonschema.validate(reply_json(close_draft, made), schema)
    client.close()


SAMPLED = SamplingParams(temperature=1.0, top_k=40)


def sampled_mismatches(url: str, target, draft) -> int:
    """Seeded, sampled replies under each schema that differ from the race of the masked target's distribution."""
    end_ids, differ = sorted(draft.end_ids), 0
    for seed in range(4):
        client = VerifyClient(url, hello_for(draft, SAMPLED, seed=seed))
        for schema in SCHEMAS:
            speculator = StreamSpeculator(draft, client, SAMPLED, seed=seed, max_block=4, grammar=grammar_of(schema))
            context = draft.tokenize(PROMPTS[0])
            made = speculator.generate(context, MAX_TOKENS).token_ids
            differ += made != constrained_target_alone(target, context, grammar_of(schema), end_ids, MAX_TOKENS,
                                                       SAMPLED, seed)
        client.close()
    return differ


def test_sampled_stream_with_a_schema_is_the_constrained_targets_race(service_on, llamacpp_target, close_draft):
    """Sampled and seeded: the stream is the race of the masked target's distribution, token for token
    (the race makes the text a function of the seed, so no statistics are needed to see it exact)."""
    assert sampled_mismatches(service_on("llamacpp").url, llamacpp_target, close_draft) == 0


def test_a_mask_applied_after_the_warp_is_caught(service_on, llamacpp_target, close_draft, monkeypatch):
    """A planted bug: the service warps (top-k 40) first and masks after; the sampled check turns red."""
    from remote_verify.session import Session

    def warp_then_mask(self, result, position, row, depth, before=()):
        if self.grammar is None:
            return original(self, result, position, row, depth, before)
        self.grammar.follow((self.committed + list(before))[self.grammar.grammar.start:])
        probs = warp(result[row], self.sampling) * self.grammar.allowed(result.shape[-1])
        if probs.sum() == 0:  # top-k kept nothing the grammar allows: its most likely allowed token
            return int(self.grammar.mask(result[row]).argmax())
        return race_choice(probs / probs.sum(), self.randomness.race(position + depth, probs.shape[0]))

    original = Session._target_pick
    monkeypatch.setattr(Session, "_target_pick", warp_then_mask)
    assert sampled_mismatches(service_on("llamacpp").url, llamacpp_target, close_draft) > 0


def test_a_mask_on_the_drafter_alone_is_caught(service_on, llamacpp_target, close_draft, monkeypatch):
    """A planted bug: the service ignores the grammar (only the drafter masks); the parity check turns red."""
    from remote_verify.session import Session

    monkeypatch.setattr(Session, "_constraint", lambda self, grammar, history, stop_ids: None)
    end_ids = sorted(close_draft.end_ids)
    client = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    differs = 0
    for schema in SCHEMAS:
        speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=4, grammar=grammar_of(schema))
        context = close_draft.tokenize(PROMPTS[0])
        made = speculator.generate(context, MAX_TOKENS).token_ids
        differs += made != constrained_target_alone(llamacpp_target, context, grammar_of(schema), end_ids, MAX_TOKENS)
    client.close()
    assert differs == len(SCHEMAS)


def test_the_drafter_guesses_inside_the_grammar(close_draft):
    """Masked, the drafter's greedy and raced guesses are tokens the grammar allows."""
    vocab = grammars.vocab_for(close_draft.vocab_fingerprint, n_vocab=close_draft.vocab_size,
                               load=lambda: [close_draft.token_text(i) for i in range(close_draft.vocab_size)])
    constraint = grammars.TokenConstraint(grammar_of(SCHEMAS[0]), vocab, close_draft.end_ids)
    context = close_draft.tokenize(PROMPTS[1])
    constraint.follow(close_draft.tokenize('{"ok":', add_bos=False))
    allowed = constraint.allowed(close_draft.vocab_size)
    assert 0 < allowed.sum() < 10
    clocks = np.random.default_rng(0).exponential(size=close_draft.vocab_size)
    assert allowed[close_draft.guess(context, SamplingParams(), None, allowed)]
    assert allowed[close_draft.guess(context, SamplingParams(temperature=1.0), clocks, allowed)]


def test_a_service_without_grammars_is_refused_the_request(service_on, close_draft):
    """A Welcome that names no grammar kinds: the generation is refused, never run unconstrained."""
    client = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    client.welcome = msgspec.structs.replace(client.welcome, grammars=[])
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), grammar=grammar_of(SCHEMAS[0]))
    with pytest.raises(GrammarUnsupported, match="cannot apply a json_schema grammar"):
        speculator.generate(close_draft.tokenize(PROMPTS[0]), MAX_TOKENS)
    client.close()
