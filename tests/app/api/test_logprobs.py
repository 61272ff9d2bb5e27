"""`logprobs` through the openai package: the target alone's, streamed or not, chat and completions."""

from __future__ import annotations

import numpy as np

from tests.app.api.test_endpoint import client
from tests.local_draft.test_stream_logprobs import target_logprobs

MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]
MAX_TOKENS = 24


def test_chat_logprobs_are_the_target_alones_streamed_or_not(endpoint, tiny, llamacpp_target, chat_prompt):
    """Greedy: each token's logprob and its top 3 equal the target alone's within 1e-4; a stream sends the same."""
    from app.chat.reply import PromptTokens
    from local_draft.chat_template import template_for
    from local_draft.draft_model import DraftModel

    api = client(endpoint)
    answer = api.chat.completions.create(model="specwire", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                         logprobs=True, top_logprobs=3)
    tokens = answer.model_extra["specwire"]["token_ids"]
    entries = answer.choices[0].logprobs.content
    tokenizer = DraftModel(tiny.draft, vocab_only=True)
    template = template_for(tokenizer.chat_template, tokenizer.token_text(tokenizer.bos_id).decode(),
                            tokenizer.token_text(tokenizer.eos_id).decode())
    prompt = PromptTokens(tokenizer, template).of(chat_prompt(MESSAGES))
    expected = target_logprobs(llamacpp_target, prompt, tokens)
    texts = [t for t in tokens if t not in tokenizer.end_ids]
    assert len(entries) == len(texts)
    for token, entry, row in zip(texts, entries, expected):
        assert entry.token == tokenizer.token_bytes(token).decode("utf-8", "replace")
        assert abs(entry.logprob - row[token]) < 1e-4
        assert len(entry.top_logprobs) == 3
        assert np.allclose([t.logprob for t in entry.top_logprobs], np.sort(row)[::-1][:3], atol=1e-4)
    streamed = list(api.chat.completions.create(model="specwire", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                temperature=0, logprobs=True, top_logprobs=3, stream=True))
    streamed_entries = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
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
