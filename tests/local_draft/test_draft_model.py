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


def test_a_tree_rerooted_below_committed_tokens_keeps_its_branches_and_guesses_as_if_read_afresh(close_draft,
                                                                                                monkeypatch):
    """When the stream commits tokens the branches had decoded, the next level moves the root down to
    them: the text takes that path's cells, the branches below it keep theirs, and the level's batch
    holds the text's newest token and the new leaves only (not the whole subtree again after a
    catch-up's decode, then the level's); committed tokens no branch decoded go in that batch too.
    Every candidate is what the drafter gives after reading that text afresh."""
    import local_draft.draft_model as draft_model

    greedy, none = SamplingParams(), (lambda position: None)
    context = close_draft.tokenize("def quicksort(arr):")
    decoded: list[int] = []  # tokens in each decode of a level (branches) or a catch-up (the text)
    decode = draft_model.llama_cpp.llama_decode
    monkeypatch.setattr(draft_model.llama_cpp, "llama_decode",
                        lambda ctx, batch: (decoded.append(batch.n_tokens), decode(ctx, batch))[1])
    eval_text = close_draft._llama.eval
    monkeypatch.setattr(close_draft._llama, "eval", lambda tokens: (decoded.append(len(tokens)), eval_text(tokens))[1])

    def level(text, paths):
        return close_draft.branch_guesses(text, paths, greedy, none)

    def afresh(text, paths):
        close_draft._drop_branches()
        close_draft.rollback(0)
        return level(text, paths)

    root = level(context, [()])[0]
    a, b = root[0][0], root[1][0]
    first = level(context, [(a,), (b,)])
    x, y = first[0][0][0], first[0][1][0]
    second = level(context, [(a, x), (a, y), (b, first[1][0][0])])
    u, w = second[0][0][0], second[0][1][0]
    third = level(context, [(a, x, u), (a, x, w), (a, y, second[1][0][0])])
    decoded.clear()

    def same(got, want):
        for options, wanted in zip(got, want):
            assert [token for token, _ in options] == [token for token, _ in wanted]
            assert np.allclose([p for _, p in options], [p for _, p in wanted], atol=2e-3)

    # the stream commits a and x: the branches below (a, x) stay, a's other branch and b's are freed
    text = context + [a, x]
    paths = [(), (u, third[0][0][0]), (w, third[1][0][0]), (9,)]
    deeper = level(text, paths)
    assert decoded == [1 + 3], decoded  # one decode: x (for the text and the new branch 9) and three leaves
    assert close_draft.evaluated == text and sorted(close_draft._branch_seq) == sorted(paths[1:])
    same(deeper, afresh(text, paths))
    # the stream takes one token past the deepest branches decoded: x's cells come from its branch,
    # the newest token is decoded with the next level
    level(text, [(5,), (6,)])
    decoded.clear()
    deeper = level(text + [5, 3], [(), (4,)])
    assert decoded == [2], decoded
    same(deeper, afresh(text + [5, 3], [(), (4,)]))
    # tokens no branch decoded (the stream left them, or passed their open leaves) go in the level's batch
    level(text, [(5,), (6,)])
    decoded.clear()
    same(level(text + [8, 3], [(), (2,)]), afresh(text + [8, 3], [(), (2,)]))
    assert decoded[0] == 3, decoded
    # a text that moved otherwise (a rewind) is read by a catch-up, and the branches decoded whole
    level(text, [(5,), (6,)])
    decoded.clear()
    same(level(text[:-1] + [4], [(), (2,)]), afresh(text[:-1] + [4], [(), (2,)]))
    assert decoded[:2] == [1, 1], decoded


def test_sampled_candidates_carry_the_races_chance_of_being_the_targets_pick():
    """Sampled, a candidate's chance is read from the race: ten equally likely tokens (0.1 each), whose
    winner's clock arrives far ahead of the rest, is the target's pick almost surely (the target races
    the same clocks); two that arrive together share the chance. The drafter's probability (0.1) says
    neither."""
    from local_draft.draft_model import _candidates

    params = SamplingParams(temperature=0.7)
    logits = np.full(64, -30.0)
    logits[:10] = 0.0  # ten tokens at 0.1 each after the warp (the rest underflow)
    clocks = np.full(64, 50.0)
    clocks[3] = 0.1  # token 3 arrives first, far ahead
    ahead = _candidates(logits, params, clocks)
    assert ahead[0][0] == 3 and ahead[0][1] > 0.95, ahead[:3]
    clocks[7] = 0.102  # token 7 arrives with it
    close = _candidates(logits, params, clocks)
    assert [token for token, _ in close[:2]] == [3, 7], close[:3]
    assert 0.4 < close[1][1] <= close[0][1] < 0.6, close[:3]
    assert sum(chance for _, chance in close) <= 1.0 + 1e-9
