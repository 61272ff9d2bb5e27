"""Grammars compile to token masks that follow, roll back and refuse what they should."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.byte_bpe import build_vocab
from wire.grammar import GrammarError, GrammarVocab, TokenConstraint, grammar_problems, token_bytes
from wire.limits import MAX_GRAMMAR_BYTES
from wire.protocol import Generate, Grammar, decode_client_message, encode

SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny_vocab():
    vocab = build_vocab()
    return vocab, GrammarVocab([text.encode("utf-8") for text in vocab.tokens])


def spell(vocab, text: str) -> list[int]:
    return [vocab.tokens.index(ch) for ch in text]


def test_token_bytes_decode_the_byte_alphabet_and_mark_control_tokens():
    """GPT-2 alphabet texts become their bytes; <|...|> and [PAD] ids are marked 0xFF."""
    assert token_bytes([b"\xc4\xa0the", b"a", b"<|im_end|>", b"[PAD7]"]) == [b" the", b"a", b"\xff<|im_end|>",
                                                                          b"\xff[PAD7]"]


def test_the_mask_walks_a_schema_to_its_end_token(tiny_vocab):
    """One allowed token at each step of {"a":true}, then only the end token."""
    vocab, grammar_vocab = tiny_vocab
    constraint = TokenConstraint(Grammar("json_schema", json.dumps(SCHEMA)), grammar_vocab, [vocab.eos_id])
    tokens = spell(vocab, '{"a":true}')
    for i, token in enumerate(tokens):
        assert constraint.follow(tokens[:i])
        allowed = constraint.allowed(vocab.size)
        assert allowed[token] and not allowed[vocab.eos_id]
    assert constraint.follow(tokens) and constraint.complete
    assert np.flatnonzero(constraint.allowed(vocab.size)).tolist() == [vocab.eos_id]


def test_follow_rolls_back_to_the_common_prefix_and_refuses_a_break(tiny_vocab):
    """Another continuation costs a roll back; a token outside the grammar is refused, the state kept."""
    vocab, grammar_vocab = tiny_vocab
    constraint = TokenConstraint(Grammar("json_schema", json.dumps(SCHEMA)), grammar_vocab, [vocab.eos_id])
    assert constraint.follow(spell(vocab, '{"a":true}'))
    assert constraint.follow(spell(vocab, '{"a":f'))
    assert constraint.followed == spell(vocab, '{"a":f')
    assert not constraint.follow(spell(vocab, '{"a":x'))
    assert constraint.followed == spell(vocab, '{"a":')
    assert constraint.follow(spell(vocab, '{"a":false}')) and constraint.complete


def test_json_object_allows_any_object_and_masks_logits(tiny_vocab):
    """json_object: the first token is "{" alone; mask() puts every other logit at -inf."""
    vocab, grammar_vocab = tiny_vocab
    constraint = TokenConstraint(Grammar("json_object"), grammar_vocab, [vocab.eos_id])
    masked = constraint.mask(np.zeros(vocab.size, dtype=np.float32))
    assert np.flatnonzero(np.isfinite(masked)).tolist() == [vocab.tokens.index("{")]


@pytest.mark.parametrize("grammar, problem", [
    (Grammar("regex", "a+"), "kind must be one of"),
    (Grammar("json_schema", "{not json"), "not JSON"),
    (Grammar("json_schema", "[1]"), "must be a JSON object"),
    (Grammar("json_schema", json.dumps({"description": "x" * MAX_GRAMMAR_BYTES})), "at most"),
    (Grammar("json_object", start=-1), "0 or more"),
])
def test_a_bad_grammar_is_named(grammar, problem):
    """Each malformed grammar gets a sentence; none is compiled."""
    assert problem in "; ".join(grammar_problems(grammar))


def test_a_schema_the_compiler_refuses_is_a_grammar_error(tiny_vocab):
    """An unsatisfiable schema is a GrammarError, not a matcher stuck in its error state."""
    vocab, grammar_vocab = tiny_vocab
    with pytest.raises(GrammarError):
        TokenConstraint(Grammar("json_schema", json.dumps({"type": "integer", "minimum": 5, "maximum": 1})),
                        grammar_vocab, [vocab.eos_id])


def test_the_grammar_travels_in_generate_and_defaults_to_none():
    """Generate round-trips its grammar; an older client's Generate decodes with none."""
    frame = Generate(seq=1, committed_len=0, append=[1], grammar=Grammar("json_object", start=1))
    assert decode_client_message(encode(frame)) == frame
    assert decode_client_message(encode(Generate(seq=1, committed_len=0))).grammar is None


def spell_bytes(vocab, text: str) -> list[int]:
    """`text` a byte at a time, each byte as the tiny vocabulary writes it (GPT-2's alphabet: a space is Ġ)."""
    from wire.byte_level import byte_to_unicode

    alphabet = byte_to_unicode()
    return [vocab.tokens.index(alphabet[b]) for b in text.encode("utf-8")]


CALL = {"type": "object", "properties": {"name": {"const": "f"}, "arguments": SCHEMA},
        "required": ["name", "arguments"], "additionalProperties": False}


def test_a_tool_calls_grammar_leaves_text_free_and_holds_each_call_to_its_schema(tiny_vocab):
    """"tool_calls": any text ends the reply; from <tool_call> on, only the call's JSON, its close tag,
    then text again (a second call too)."""
    vocab, grammar_vocab = tiny_vocab
    constraint = TokenConstraint(Grammar("tool_calls", json.dumps(CALL)), grammar_vocab, [vocab.eos_id])
    text = spell_bytes(vocab, "Sure, x<y and a <b> tag. ")
    assert constraint.follow(text) and constraint.complete
    call = spell_bytes(vocab, '<tool_call>\n{"name":"f","arguments":{"a":true}}\n</tool_call>')
    assert constraint.follow(text + call + spell_bytes(vocab, " done ") + call) and constraint.complete
    opened = text + spell_bytes(vocab, '<tool_call>\n{"name":"')
    assert constraint.follow(opened) and not constraint.complete  # inside a call the reply cannot end
    assert np.flatnonzero(constraint.allowed(vocab.size)).tolist() == spell_bytes(vocab, "f")
    assert not constraint.follow(opened + spell_bytes(vocab, 'g'))  # a function the tools do not have
    assert not TokenConstraint(Grammar("tool_calls", json.dumps(CALL)), grammar_vocab, [vocab.eos_id]).follow(
        spell_bytes(vocab, '<tool_call>\n{"name":"f","arguments":{"a":1}}'))  # arguments off their schema


def test_a_tool_calls_grammar_needs_a_schema_object():
    assert grammar_problems(Grammar("tool_calls", "[1]")) == ["the schema must be a JSON object"]
