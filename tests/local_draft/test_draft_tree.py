"""The client's tree shape (local_draft/draft_tree.py): best-first growth, pure Python, no models."""

from __future__ import annotations

from local_draft.draft_tree import ALTERNATE_ABOVE, DraftTree
from wire.draft_tree import ROOT, tree_problem

END = frozenset({99})


def _grow(tree: DraftTree, options_for) -> None:
    tree.grow([options_for(path) for path in tree.open_paths()], END)


def test_a_sure_drafter_grows_a_chain_and_an_unsure_one_branches():
    """First choices at 0.95 make a chain whatever the width; one at 0.5 adds its alternatives
    (those above ALTERNATE_ABOVE), and both branches grow at the next level."""
    tree = DraftTree(number=1, start=10, width=4)
    for _ in range(3):
        _grow(tree, lambda path: [(len(path) + 1, 0.95), (50, 0.03), (51, 0.01)])
    assert tree.parents == [ROOT, 0, 1] and tree.levels == 3
    _grow(tree, lambda path: [(7, 0.5), (8, 0.4), (9, ALTERNATE_ABOVE / 2)])
    assert tree.tokens[3:] == [7, 8] and tree.parents[3:] == [2, 2] and len(tree.open) == 2
    _grow(tree, lambda path: [(path[-1] + 10, 0.9)])
    assert tree.parents[5:] == [3, 4] and tree_problem(tree.parents, len(tree.tokens)) == ""


def test_a_branch_left_behind_grows_again_once_it_is_likelier_than_the_deepest_leaf():
    """Width 2, three first branches: the two likeliest grow; when their paths' chances fall below
    the third's, it is grown (best-first); an end token is never grown."""
    tree = DraftTree(number=1, start=0, width=2)
    _grow(tree, lambda path: [(1, 0.5), (2, 0.3), (3, 0.2)])
    assert [tree.path(node) for node in tree.open] == [(1,), (2,)]
    _grow(tree, lambda path: [(path[-1] + 10, 0.5)])  # (1, 11): 0.25, (2, 12): 0.15, and (3,): 0.2
    assert [tree.path(node) for node in tree.open] == [(3,), (1, 11)]
    _grow(tree, lambda path: [(99, 0.9)])  # end tokens below both: nothing grows after them
    assert [tree.path(node) for node in tree.open] == [(2, 12)]


def test_the_subtree_the_stream_took_keeps_growing_from_its_likeliest_leaves():
    """After the stream committed an alternative, its subtree is the tree, and its leaves are
    open even where the beam had left them (a tree that could not grow waited a round trip)."""
    tree = DraftTree(number=3, start=0, width=2)
    _grow(tree, lambda path: [(1, 0.5), (2, 0.45)])
    for _ in range(3):  # width 2 keeps both branches growing; then only the first
        _grow(tree, lambda path: [(path[-1] + 10, 0.99)])
    tree.width = 1
    _grow(tree, lambda path: [(path[-1] + 10, 0.99)])
    tree.sent = len(tree.tokens)
    followed = tree.follow([2, 12])
    assert followed[:3] == (2, 1, 1) and followed.carried == 1  # the service held the alternative's child
    right = followed.right
    below = tree.below(right, [2, 12], tree.number, END)
    assert below is not None and below.number == 3 and below.start == 2
    assert tree.open == [len(tree.tokens) - 2]  # the beam had left the second branch
    assert [below.path(node) for node in below.open] == [(22, 32, 42)]


def test_a_tree_goes_out_likeliest_first_so_a_short_pass_keeps_the_likeliest_nodes():
    """A Draft carries the tree with its likeliest nodes first (parents still before children): a pass
    with room for k nodes takes the first k (wire/draft_tree.py), which are then the k likeliest, and
    the same tree (same paths) as the one grown."""
    tree = DraftTree(number=1, start=0, width=4)
    _grow(tree, lambda path: [(1, 0.5), (2, 0.3), (3, 0.2)])  # three first branches
    _grow(tree, lambda path: [(path[-1] + 10, 0.95)])  # each grows a sure child
    tokens, parents = tree.likeliest_first()
    assert tree_problem(parents, len(tokens)) == ""
    chances = sorted(tree.chance, reverse=True)
    order = [tree.chance[tree.tokens.index(token)] for token in tokens]
    assert order == chances  # 0.5, 0.475, 0.3, 0.285, 0.2, 0.19
    assert tokens[:2] == [1, 11] and parents[:2] == [ROOT, 0]  # a pass of two nodes: the likeliest path
    grown = sorted(tree.path(node) for node in range(len(tree.tokens)))
    resent = DraftTree(number=2, start=0, width=4, tokens=tokens, parents=parents)
    assert sorted(resent.path(node) for node in range(len(tokens))) == grown
