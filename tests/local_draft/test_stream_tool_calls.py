"""Under `tool_choice: auto` a call the model starts is held to the tools' schemas, exactly.

The reply's grammar is `specwire api`'s for auto (app/api/tool_calls.py `Tools.grammar`, kind
"tool_calls" in wire/grammar.py): free text, in which every `<tool_call>` opens a call whose JSON
must name a tool and match its parameters. A tiny random model never writes the tag by itself,
so the context ends with one already opened (the stream's `grammar_lead`: the grammar starts
before the reply, and the service checks the tokens it has already), and the reply goes on inside
the call: greedy, in the default mode with the drafter's guesses, it must equal the target alone
with every step masked by the same grammar, and the call it writes must be read back as one call
with valid arguments.
"""

from __future__ import annotations

import json

import jsonschema

from app.api.tool_calls import parse_tools
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from wire import grammar as grammars
from wire.protocol import SamplingParams
from tests.conftest import hello_for

WEATHER_ARGUMENTS = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome", "Lima"]}},
                     "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_ARGUMENTS}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
             "additionalProperties": False}}}]
LEAD = "Let me look that up.<tool_call>\n"  # text, then the call opened
MAX_TOKENS = 72  # the tiny vocabulary spells most of a call a byte a token: it closes within about 60


def masked_target_alone(target, context: list[int], lead: int, grammar, end_ids: list[int], n: int) -> list[int]:
    """The target alone, greedy, each step masked by `grammar`, which starts `lead` tokens before the reply."""
    vocab = grammars.vocab_for(f"reference:{id(target)}", load=target.token_texts, n_vocab=target.vocab_size)
    constraint = grammars.TokenConstraint(grammar, vocab, end_ids)
    cache, tokens = target.new_cache(), []
    logits = target.forward(cache, context, 1)
    for _ in range(n):
        assert constraint.follow(context[len(context) - lead:] + tokens)
        tokens.append(int(constraint.mask(logits[-1]).argmax()))
        if tokens[-1] in end_ids:
            break
        logits = target.forward(cache, tokens[-1:], 1)
    return tokens


def test_a_started_call_under_auto_is_the_constrained_target_alone(paced_service, llamacpp_target, close_draft):
    """Text, then a call opened: the default mode's reply equals the masked target's token for token, and
    the call it makes is read back with valid arguments. The service is paced like a GPU elsewhere:
    the tiny target alone streams faster than a busy machine's client reads, and a client behind the
    stream has no guess verified (one full run here: 72 tokens, none drafted)."""
    tools = parse_tools({"tools": TOOLS})
    grammar = tools.grammar()
    assert grammar.kind == "tool_calls"
    end_ids = sorted(close_draft.end_ids)
    client = VerifyClient(paced_service.url, hello_for(close_draft))
    assert "tool_calls" in client.welcome.grammars
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=4, end_ids=end_ids, grammar=grammar,
                                  colocated=False)
    prompt = close_draft.tokenize("What is the weather?")
    lead = close_draft.tokenize(LEAD, add_bos=False)
    speculator.grammar_lead = len(lead)
    made = speculator.generate(prompt + lead, MAX_TOKENS)
    assert made.token_ids == masked_target_alone(llamacpp_target, prompt + lead, len(lead), grammar, end_ids,
                                                 MAX_TOKENS)
    assert made.stats.accepted > 0  # the drafter's masked guesses were kept: the speculative path was taken
    text = b"".join(close_draft.token_bytes(t) for t in lead + made.token_ids if t not in end_ids).decode()
    assert grammars.CALL_CLOSE in text, text  # the call was finished within the reply
    _, calls = tools.read(text)
    assert len(calls) >= 1, text
    for call in calls:
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call["function"]["name"])
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    client.close()
