"""A session refuses a grammar it cannot apply, and follows a resumed one from where it started."""

from __future__ import annotations

import json

import pytest

from remote_verify.session import Session, SessionError, SessionLimits
from wire.protocol import Generate, Grammar, SamplingParams

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
                     "additionalProperties": False})
PROMPT = [318, 104, 105]  # BOS, "h", "i" in the tiny vocabulary


def session_on(backend) -> Session:
    return Session(backend, SamplingParams(), seed=0, limits=SessionLimits(max_draft=8, max_context=256))


def spell(text: str) -> list[int]:
    return list(text.encode())  # the tiny vocabulary's first 256 ids are the bytes, in GPT-2's alphabet order


@pytest.mark.parametrize("grammar, stop_ids, append, words", [
    (Grammar("json_schema", SCHEMA), [], PROMPT, "needs stop_ids"),
    (Grammar("json_schema", SCHEMA, start=9), [319], PROMPT, "after the history's end"),
    (Grammar("json_schema", SCHEMA, start=3), [319], PROMPT + spell('{"b'), "break the grammar"),
    (Grammar("json_schema", json.dumps({"type": "integer", "minimum": 3, "maximum": 1})), [319], PROMPT,
     "cannot be compiled"),
    (Grammar("yaml"), [319], PROMPT, "kind must be one of"),
])
def test_a_grammar_that_cannot_apply_is_refused_and_nothing_changes(llamacpp_target, grammar, stop_ids, append, words):
    """Each is a bad_grammar error naming the problem; the history is left as it was."""
    session = session_on(llamacpp_target)
    with pytest.raises(SessionError) as refused:
        session.start_generation(Generate(seq=1, committed_len=0, append=append, stop_ids=stop_ids, grammar=grammar))
    assert refused.value.code == "bad_grammar" and words in refused.value.message
    assert session.committed == [] and session.grammar is None


def test_a_resumed_stream_follows_its_grammar_from_its_start(llamacpp_target):
    """Tokens made before a reconnect are taken as the grammar's: the next picks complete the value."""
    session = session_on(llamacpp_target)
    session.start_generation(Generate(seq=1, committed_len=0, append=PROMPT + spell('{"a":t'), stop_ids=[319],
                                      grammar=Grammar("json_schema", SCHEMA, start=3)))
    made = [session.generate_step()[0] for _ in range(4)]
    assert bytes(made) == b"rue}"
