"""A tree of guesses: its checks, the part a pass takes, and the walk by the target's picks."""

from __future__ import annotations

import msgspec
import pytest

from remote_verify.frames import BadFrame, FrameReader
from wire.draft_tree import ROOT, GuessTree, tree_problem, walk
from wire.limits import MAX_TREE_DEPTH, MAX_TREE_NODES, MAX_TREE_WIDTH
from wire.protocol import Draft, Welcome, decode_client_message, decode_server_message, encode

# Two guesses for the next token (10, 20); below 10, two for the one after (11, 12); below 12, one (13).
TOKENS = [10, 20, 11, 12, 13]
PARENTS = [ROOT, ROOT, 0, 0, 3]


def test_a_tree_travels_in_a_draft_and_old_frames_still_read_as_chains():
    """A Draft's parents round-trip; a Draft without them (an older client's) is a chain, and a
    Welcome that does not say `trees` says no."""
    tree = Draft(seq=1, chain=2, start=7, tokens=TOKENS, parents=PARENTS)
    assert decode_client_message(encode(tree)) == tree
    old = msgspec.msgpack.encode({"type": "draft", "seq": 1, "chain": 1, "start": 7, "tokens": [1, 2]})
    assert decode_client_message(old).parents == []
    old_welcome = msgspec.msgpack.encode({"type": "welcome", "session_id": "s", "max_context": 64, "max_draft": 8,
                                          "vocab_size": 100})
    assert decode_server_message(old_welcome).trees is False
    assert decode_server_message(encode(Welcome("s", 64, 8, 100, trees=True))).trees is True


@pytest.mark.parametrize("parents, tokens, words", [
    ([ROOT, 1], 2, "parent 1"),  # a parent after its child
    ([ROOT, 0, 5], 3, "parent 5"),
    ([ROOT, -2], 2, "parent -2"),
    ([ROOT], 2, "one parent per token"),
    ([ROOT] * (MAX_TREE_WIDTH + 1), MAX_TREE_WIDTH + 1, "children"),
    (list(range(-1, MAX_TREE_DEPTH)), MAX_TREE_DEPTH + 1, "deep"),
])
def test_a_malformed_tree_is_named_for_what_is_wrong(parents, tokens, words):
    """A parent not before its node, a count that differs from the tokens', too wide, too deep:
    each refused with a sentence saying so."""
    assert words in tree_problem(parents, tokens)


def test_well_formed_trees_and_chains_pass_the_check():
    """The example tree, the widest and deepest allowed, and the empty list (a chain) pass."""
    assert tree_problem(PARENTS, len(TOKENS)) == ""
    assert tree_problem([ROOT] * MAX_TREE_WIDTH, MAX_TREE_WIDTH) == ""
    assert tree_problem(list(range(-1, MAX_TREE_DEPTH - 1)), MAX_TREE_DEPTH) == ""
    assert tree_problem([], 500) == ""


def test_a_tree_over_the_node_bound_is_refused_from_its_length_header():
    """The service's decoder refuses a tree of more than MAX_TREE_NODES parents with bad_tree."""
    reader = FrameReader(max_context=4096, max_draft=32)
    frame = encode(Draft(seq=1, chain=1, start=0, tokens=[1] * (MAX_TREE_NODES + 1),
                         parents=[ROOT] * (MAX_TREE_NODES + 1)))
    with pytest.raises(BadFrame) as refused:
        reader.read(frame)
    assert refused.value.code == "bad_tree" and str(MAX_TREE_NODES) in refused.value.message


def test_first_choice_path_subtree_and_pruning():
    """The chain of first children; the nodes below one as a tree of their own; a prefix of the
    nodes within a depth, without what follows a stop token."""
    tree = GuessTree(TOKENS, PARENTS)
    assert tree.first_choice_path() == [0, 2]
    below = tree.below(0)
    assert (below.tokens, below.parents) == ([11, 12, 13], [ROOT, ROOT, 1])
    assert tree.pruned(3, 10).tokens == [10, 20, 11]
    assert tree.pruned(10, 2).tokens == [10, 20, 11, 12]
    assert tree.pruned(10, 10, stops=frozenset({12})).tokens == [10, 20, 11, 12]
    assert tree.pruned(10, 10, stops=frozenset({10})).tokens == [10, 20]
    assert GuessTree.chain([4, 5, 6]).is_chain and not tree.is_chain


def test_the_walk_keeps_the_child_equal_to_the_pick_at_its_parents_row():
    """Picks read from the parent's row: 10 at the root's, then 12 at node 0's, then 13 at node 3's,
    then the target's own 99 at node 4's; a pick no child guessed ends the walk there."""
    picks_by_row = {0: 10, 1: 12, 4: 13, 5: 99}
    asked = []

    def pick(row: int, depth: int) -> int:
        asked.append((row, depth))
        return picks_by_row.get(row, -1)

    assert walk(GuessTree(TOKENS, PARENTS), pick) == ([0, 3, 4], 99)
    assert asked == [(0, 0), (1, 1), (4, 2), (5, 3)]
    assert walk(GuessTree(TOKENS, PARENTS), lambda row, depth: 20 if row == 0 else 7) == ([1], 7)
    assert walk(GuessTree([], []), lambda row, depth: 5) == ([], 5)


def test_a_kept_stop_token_ends_the_walk_with_nothing_picked_after_it():
    """A stop token the target picks ends the text: the walk asks for no token after it (a grammar
    has no state past its end)."""
    asked = []

    def pick(row: int, depth: int) -> int:
        asked.append(row)
        return {0: 5, 1: 319}.get(row, 7)

    assert walk(GuessTree.chain([5, 319]), pick, frozenset({319})) == ([0, 1], None)
    assert asked == [0, 1]
    assert walk(GuessTree.chain([5, 319]), pick) == ([0, 1], 7)  # without stops: the token after it


def random_tree(rng, nodes: int, vocab: int) -> GuessTree:
    """A tree of `nodes` guesses over `vocab` tokens, each node's parent an earlier node or ROOT (repeated
    tokens among siblings included: the first of them is the one a walk takes)."""
    parents = [rng.randrange(-1, i) for i in range(nodes)]
    return GuessTree([rng.randrange(vocab) for _ in range(nodes)], parents)


def test_a_child_is_found_alike_with_and_without_the_index_of_children():
    """`child_with` and `has_children` answer from the parent list when the tree was never indexed (a stream
    walks a client's new tree a few nodes a pass); on every node and token of many random trees they answer
    what the index answers, and walking a history down a tree leaves it unindexed."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        nodes = rng.randrange(1, 40)
        tree = random_tree(rng, nodes, vocab=4)
        fresh = GuessTree(tree.tokens, tree.parents)
        answers = [(fresh.child_with(node, token), fresh.has_children(node))
                   for node in range(-1, nodes) for token in range(4)]
        assert fresh._children is None  # answered without the index
        tree.children(ROOT)  # the index, built
        assert answers == [(tree.child_with(node, token), bool(tree.children(node)))
                           for node in range(-1, nodes) for token in range(4)]
    chain = GuessTree([5, 6, 7], [-1, 0, 1])
    assert chain.is_chain and chain.child_with(0, 6) == 1 and chain.child_with(0, 5) is None
    assert not chain.has_children(2) and chain.has_children(ROOT)
