"""The client's tree shape (local_draft/draft_tree.py): best-first growth, pure Python, no models."""

from __future__ import annotations

from local_draft.draft_tree import ALTERNATE_ABOVE, DraftTree
from wire.draft_tree import ROOT, tree_problem
from wire.limits import MAX_TREE_NODES

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


def _first_choice_depth(tree: DraftTree) -> int:
    """How deep the path of first choices reaches."""
    node, depth = ROOT, 0
    while True:
        child = next((i for i, parent in enumerate(tree.parents) if parent == node and tree.rank[i] == 0), None)
        if child is None:
            return depth
        node, depth = child, depth + 1


def test_a_full_tree_drops_its_least_likely_leaves_and_keeps_growing():
    """An unsure drafter adds seven alternatives a leaf: the tree reaches MAX_TREE_NODES within a few
    levels. It then keeps growing where it is likeliest, dropping its least likely leaves (a full tree
    that stopped growing let the stream run past its end at a long round trip), never above the cap,
    and what was sent stays a prefix of it."""
    tree = DraftTree(number=1, start=0, width=8)
    options = lambda path: [(len(path) + 1, 0.7)] + [(100 + i, 0.04) for i in range(7)]
    while len(tree.tokens) < MAX_TREE_NODES:
        _grow(tree, options)
    full_depth = _first_choice_depth(tree)
    sent_nodes = [tree.path(node) for node in range(len(tree.tokens))]
    tree.sent = len(tree.tokens)
    dropped_below = None
    for _ in range(20):
        before = {tree.path(node): tree.chance[node] for node in range(len(tree.tokens))}
        assert tree.open, "a full tree stopped growing"
        _grow(tree, options)
        after = {tree.path(node) for node in range(len(tree.tokens))}
        assert len(after) <= MAX_TREE_NODES and tree_problem(tree.parents, len(tree.tokens)) == ""
        dropped = [chance for path, chance in before.items() if path not in after]
        if dropped:
            dropped_below = max(dropped)
            assert dropped_below <= min(tree.chance) + 1e-12  # the least likely went
    assert dropped_below is not None
    assert _first_choice_depth(tree) >= full_depth + 5
    kept_sent = [path for path in sent_nodes if path in {tree.path(node) for node in range(len(tree.tokens))}]
    assert [tree.path(node) for node in range(tree.sent)] == kept_sent


def test_leaves_at_the_depth_limit_wait_while_shallower_ones_grow():
    """The likeliest branch at the horizon waits; the branches left behind grow instead of the drafter
    idling (over a long round trip the stream may have taken one of them), and the deep leaf grows
    again once the horizon moves."""
    tree = DraftTree(number=1, start=0, width=2)
    _grow(tree, lambda path: [(1, 0.5), (2, 0.09), (3, 0.08)])  # the alternatives below OPEN_RATIO: not grown
    assert [tree.path(node) for node in tree.open] == [(1,)]
    tree.limit(3, END)
    for _ in range(2):
        _grow(tree, lambda path: [(path[-1] + 10, 0.95)])
    assert tree.levels == 0 or all(tree.depths[node] < 3 for node in tree.open)
    assert sorted(tree.path(node) for node in tree.open) == [(2,), (3,)]  # the chain (1, 11, 21) waits
    _grow(tree, lambda path: [(path[-1] + 10, 0.95)])
    assert {(2, 12), (3, 13)} <= {tree.path(node) for node in range(len(tree.tokens))}
    tree.limit(5, END)
    assert (1, 11, 21) in [tree.path(node) for node in tree.open]


def test_a_leaf_whose_children_a_full_tree_dropped_grows_again_below_the_stream():
    """Pruning a full tree can leave a grown node childless; once the stream commits past the root the
    subtree has room, and that node grows again."""
    tree = DraftTree(number=1, start=0, width=4)
    _grow(tree, lambda path: [(1, 0.9)])
    _grow(tree, lambda path: [(11, 0.6), (12, 0.3)])  # (1, 11) and (1, 12)
    _grow(tree, lambda path: [(path[-1] + 10, 0.1)])  # their children, the least likely nodes
    tree._prune(len(tree.tokens) - 2, len(tree.tokens))  # a full tree drops both
    assert {tree.path(node) for node in range(len(tree.tokens))} == {(1,), (1, 11), (1, 12)}
    tree.sent = len(tree.tokens)
    below = tree.below(1, [1], tree.number, END)
    assert sorted(below.path(node) for node in below.open) == [(11,), (12,)]
