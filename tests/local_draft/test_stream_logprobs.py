"""Log probabilities in the stream are the target's, for guessed tokens and its own picks alike."""

from __future__ import annotations

import numpy as np
import pytest

from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from tests.conftest import hello_for
from tests.local_draft.test_stream_grammar import SCHEMAS, grammar_of
from wire import grammar as grammars
from wire.protocol import SamplingParams

PROMPTS = ["def quicksort(arr):", "The quick brown fox"]
MAX_TOKENS = 24
TOP = 5


def target_logprobs(target, context: list[int], tokens: list[int], grammar=None, end_ids=()) -> list[np.ndarray]:
    """The target alone's log-softmax (V,) at each of `tokens`' positions (masked by the grammar, if any)."""
    constraint = None
    if grammar is not None:
        vocab = grammars.vocab_for(f"reference:{id(target)}", load=target.token_texts, n_vocab=target.vocab_size)
        constraint = grammars.TokenConstraint(grammar, vocab, end_ids)
    logits = target.forward(target.new_cache(), context + tokens[:-1], len(tokens)).astype(np.float64)  # (n, V)
    rows = []
    for i, row in enumerate(logits):
        if constraint is not None:
            assert constraint.follow(tokens[:i])
            row = constraint.mask(row)
        rows.append(row - (row.max() + np.log(np.exp(row - row.max()).sum())))
    return rows


def check_logprobs(url: str, target, close_draft, with_grammar: bool) -> int:
    """Every token's logprob and its top 5 from the stream at `url` equal the target alone's within 1e-4;
    returns how many of the tokens were the drafter's guesses."""
    grammar = grammar_of(SCHEMAS[0]) if with_grammar else None
    end_ids = sorted(close_draft.end_ids)
    client = VerifyClient(url, hello_for(close_draft))
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=4, grammar=grammar, logprobs=TOP)
    guessed = 0
    for prompt in PROMPTS:
        context = close_draft.tokenize(prompt)
        result = speculator.generate(context, MAX_TOKENS)
        tokens = result.token_ids
        guessed += result.stats.accepted
        assert len(speculator.token_logprobs) == len(tokens)
        for token, given, expected in zip(tokens, speculator.token_logprobs,
                                          target_logprobs(target, context, tokens, grammar, end_ids)):
            assert abs(given.logprob - expected[token]) < 1e-4
            assert len(given.top_ids) == min(TOP, int(np.isfinite(expected).sum()))
            assert np.allclose(given.top_logprobs, expected[given.top_ids], atol=1e-4)
            assert np.all(np.sort(expected)[::-1][: len(given.top_ids)] - given.top_logprobs < 1e-4)  # the most likely
    client.close()
    return guessed


@pytest.mark.parametrize("with_grammar", [False, True], ids=["free", "schema"])
def test_logprobs_are_the_target_alones(service, target, close_draft, with_grammar):
    """Each backend, with a schema and without: each token's logprob and top 5 are the target alone's."""
    check_logprobs(service.url, target, close_draft, with_grammar)


def test_logprobs_of_guessed_tokens_are_the_target_alones(paced_service, llamacpp_target, close_draft):
    """Behind a GPU-paced service, where guesses are kept: theirs are the target's too (from the pass keeping them)."""
    # how many guesses are kept depends on the machine's timing (49 of 96 tokens here): not asserted
    check_logprobs(paced_service.url, llamacpp_target, close_draft, True)
    check_logprobs(paced_service.url, llamacpp_target, close_draft, False)
