"""The n-gram drafter on hand-built contexts: longest match, most recent occurrence, roll back."""

from __future__ import annotations

import random

import pytest

from local_draft.ngram_draft import NGramDrafter, point_mass


def test_the_longest_suffix_seen_before_wins():
    """A 3-token suffix seen once beats its last token seen more recently elsewhere."""
    drafter = NGramDrafter(max_n=4)
    context = [1, 2, 3, 10, 11, 9, 3, 20, 1, 2, 3]  # "1 2 3" -> 10 11; "3" alone last led to 20
    proposal = drafter.propose(context, 2)
    assert proposal.match_len == 3
    assert proposal.tokens == [10, 11]


def test_the_most_recent_occurrence_wins_among_equal_lengths():
    """Two earlier occurrences of the suffix: the later one's continuation is proposed."""
    drafter = NGramDrafter(max_n=2)
    context = [5, 6, 7, 0, 5, 6, 8, 0, 5, 6]
    proposal = drafter.propose(context, 1)
    assert proposal == drafter.propose(context, 1)
    assert proposal.match_len == 2 and proposal.tokens == [8]


def test_no_match_proposes_nothing():
    """A last token never seen before: match length 0, no tokens."""
    drafter = NGramDrafter()
    proposal = drafter.propose([1, 2, 3, 4], 5)
    assert proposal.match_len == 0 and proposal.tokens == []


def test_a_match_near_the_end_continues_its_own_copy():
    """A repeating run keeps repeating past the end of the context (period 2 here)."""
    drafter = NGramDrafter(max_n=3)
    proposal = drafter.propose([9, 1, 2, 1, 2, 1], 5)
    assert proposal.match_len == 3  # "1 2 1" at positions 1-3, followed by 2 at 4
    assert proposal.tokens == [2, 1, 2, 1, 2]


def test_rolling_back_restores_the_index_exactly():
    """After a new context replaces part of the old one, lookups equal those of a fresh index."""
    rng = random.Random(0)
    drafter = NGramDrafter(max_n=4)
    for _ in range(200):
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 60))]
        if rng.random() < 0.5 and drafter.tokens:  # often a continuation or a retry of the last one
            keep = rng.randrange(len(drafter.tokens) + 1)
            context = drafter.tokens[:keep] + context[: rng.randrange(0, 10)] or [1]
        fresh = NGramDrafter(max_n=4)
        for k in (1, 3, 8):
            assert drafter.propose(context, k) == fresh.propose(context, k), context
        assert drafter.tokens == list(context)


def test_the_index_grows_by_one_update_per_token():
    """Extending the context by one token indexes only that token (no rebuild)."""
    drafter = NGramDrafter(max_n=3)
    drafter.sync(list(range(100)))
    drafter.sync(list(range(100)) + [7])
    assert len(drafter._undo) == 101 and len(drafter._undo[-1]) == 3


def test_point_mass_is_all_on_the_token():
    """The draft distribution sent under sampling is exactly the proposed token with probability 1."""
    dist = point_mass(42)
    assert dist.ids == [42] and dist.probs == [1.0]


def test_max_n_must_be_positive():
    """A drafter matching no length at all is refused with a reason."""
    with pytest.raises(ValueError, match="max_n"):
        NGramDrafter(max_n=0)
