"""Tree attention on the torch backend: each node scores as the chain of its ancestors would."""

from __future__ import annotations

import numpy as np

from wire.draft_tree import ROOT

TOLERANCE = 1e-3  # a block's logits differ from the same tokens one at a time by ~1e-4 (torch_backend.py)


def test_each_node_of_a_tree_scores_as_its_own_chain_and_the_kept_path_is_what_stays(torch_target):
    """A pass of a tree: every node's row equals the last row of its ancestors' chain run alone; after
    keep_path the cache is that of the kept path, so the next pass scores as after the chain."""
    target = torch_target
    history = [1, 40, 41, 42]
    tokens = [50, 60, 51, 52, 61, 53]
    parents = [ROOT, ROOT, 0, 0, 1, 3]
    cache = target.new_cache()
    target.forward(cache, history[:-1], 1)
    rows = target.forward(cache, history[-1:] + tokens, len(tokens) + 1, tree=parents)  # (7, V)

    def chain_of(node: int) -> list[int]:
        path = []
        while node != ROOT:
            path.insert(0, tokens[node])
            node = parents[node]
        return path

    for node in [ROOT] + list(range(len(tokens))):
        alone = target.forward(target.new_cache(), history + chain_of(node), 1)[-1]
        assert np.abs(rows[node + 1] - alone).max() < TOLERANCE, node
    target.keep_path(cache, len(history), [0, 3, 5])  # 50, 52, 53
    target.truncate(cache, len(history) + 3)
    after = target.forward(cache, [7], 1)[-1]
    alone = target.forward(target.new_cache(), history + [50, 52, 53, 7], 1)[-1]
    assert np.abs(after - alone).max() < TOLERANCE
