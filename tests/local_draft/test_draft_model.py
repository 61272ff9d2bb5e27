"""The llama.cpp draft model: tokenizer round trip, drafting, and cache roll back."""

from __future__ import annotations

import numpy as np

from wire.protocol import SamplingParams, vocab_fingerprint

TEXTS = ["hello world", "déjà vu — ünïcödé", "emoji 🎉🧪 and 中文", "\x00\x01 bytes\n\ttabs", "def f(self): return x"]


def test_any_utf8_text_round_trips(close_draft):
    """Byte-level BPE: tokenize then detokenize gives the text back."""
    for text in TEXTS:
        ids = close_draft.tokenize(text, add_bos=False)
        assert b"".join(close_draft.token_bytes(t) for t in ids).decode("utf-8") == text


def test_drafters_and_target_share_one_vocabulary(close_draft, far_draft, target):
    """Both drafters and the target have the same fingerprint."""
    assert close_draft.vocab_fingerprint == far_draft.vocab_fingerprint
    assert close_draft.vocab_fingerprint == vocab_fingerprint(target.token_texts())


def test_greedy_proposal_follows_its_own_argmax_and_survives_rollback(close_draft):
    """Drafting after a roll back gives what drafting from scratch gives."""
    greedy = SamplingParams()
    rng = np.random.default_rng(0)
    context = close_draft.tokenize("the cat")
    first, _ = close_draft.propose(context, 6, greedy, rng)
    longer, _ = close_draft.propose(context + [first[0], 7], 4, greedy, rng)  # diverge, then
    again, _ = close_draft.propose(context, 6, greedy, rng)  # come back: prefix reused
    assert again == first
    assert close_draft.evaluated[: len(context)] == context
    assert len(longer) == 4


def test_sampled_proposals_come_with_their_distribution(close_draft):
    """Each sampled draft token lies in the sparse distribution sent with it."""
    rng = np.random.default_rng(0)
    tokens, dists = close_draft.propose(close_draft.tokenize("x"), 5, SamplingParams(temperature=1.0), rng)
    assert len(dists) == 5
    for token, dist in zip(tokens, dists):
        assert token in dist.ids and len(dist.ids) <= 64
        assert abs(sum(dist.probs) - 1.0) < 1e-6


def test_keep_up_evaluates_only_what_the_cache_lacks(close_draft):
    """keep_up (run by adaptive k's rounds at k = 0 while a verdict is in flight) leaves the
    cache holding the context, so the next block needs no catch-up."""
    ids = close_draft.tokenize("The quick brown fox")
    close_draft.keep_up(ids)
    assert close_draft.evaluated == ids
    close_draft.keep_up(ids + [5, 6])
    assert close_draft.evaluated == ids + [5, 6]
    assert close_draft.last_catch_up == 2


def test_a_catch_up_cut_short_keeps_what_it_evaluated(close_draft):
    """While a verdict is in flight a long catch-up runs in pieces and stops when told: the cache keeps
    the pieces done, the next catch-up evaluates only the rest, and drafting ahead makes no guess."""
    from local_draft.draft_model import CATCH_UP_PIECE

    ids = close_draft.tokenize("def moving_average(x, window):\n    return [sum(x[i:i + window]) / window "
                               "for i in range(len(x) - window + 1)]")
    assert len(ids) > 2 * CATCH_UP_PIECE
    close_draft.rollback(0)
    answers = iter([False, True])
    close_draft.keep_up(ids, should_stop=lambda: next(answers))
    assert close_draft.evaluated == ids[:CATCH_UP_PIECE]
    close_draft.rollback(0)
    assert close_draft.draft_ahead(ids, 4, SamplingParams(), np.random.default_rng(0), lambda: True) == (None, [], [])
    close_draft.keep_up(ids)
    assert close_draft.evaluated == ids and close_draft.last_catch_up == len(ids)


def test_branches_decoded_together_guess_what_each_alone_would(close_draft):
    """A level of branches in one batch (some cached, some new, one two tokens deep): each branch's
    first candidate is the guess the drafter makes after that text alone."""
    greedy, none = SamplingParams(), (lambda position: None)
    context = close_draft.tokenize("def quicksort(arr):")
    root = close_draft.branch_guesses(context, [()], greedy, none)[0]
    assert root[0][0] == close_draft.guess(context, greedy, None) and root[0][1] >= root[1][1]
    a, b = root[0][0], root[1][0]
    close_draft.branch_guesses(context, [()], greedy, none)
    level = close_draft.branch_guesses(context, [(a,), (b,)], greedy, none)
    x = level[0][0][0]
    deeper = close_draft.branch_guesses(context, [(a, x), (a, level[0][1][0]), (b, 7, 9)], greedy, none)
    alone = [close_draft.guess(context + list(path), greedy, None)
             for path in [(a, x), (a, level[0][1][0]), (b, 7, 9)]]
    assert [options[0][0] for options in deeper] == alone
    cost = close_draft.batch_cost(context)
    assert set(cost) == {1, 2, 4, 8} and cost[1] == 1.0
