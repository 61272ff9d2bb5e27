"""Tree attention on the torch backends (eager, static): each node scores as the chain of its ancestors would."""

from __future__ import annotations

import numpy as np
import pytest

from remote_verify.backends.target import Pass
from wire.draft_tree import ROOT

TOLERANCE = 1e-3  # a block's logits differ from the same tokens one at a time by ~1e-4 (torch_backend.py)
HISTORY = [1, 40, 41, 42]
TOKENS = [50, 60, 51, 52, 61, 53]
PARENTS = [ROOT, ROOT, 0, 0, 1, 3]
KEPT = [0, 3, 5]  # 50, 52, 53


@pytest.fixture(scope="module")
def static_target(tiny):
    from remote_verify.backends.torch_static import TorchStaticTarget

    return TorchStaticTarget(tiny.target, device="cpu", slots=4, context=256)


def chain_of(node: int) -> list[int]:
    path = []
    while node != ROOT:
        path.insert(0, TOKENS[node])
        node = PARENTS[node]
    return path


@pytest.mark.parametrize("kind", ["torch_target", "static_target"])
def test_each_node_of_a_tree_scores_as_its_own_chain_and_the_kept_path_is_what_stays(request, kind):
    """A pass of a tree: every node's row equals the last row of its ancestors' chain run alone; after
    keep_path the cache is that of the kept path, so the next pass scores as after the chain."""
    target = request.getfixturevalue(kind)
    cache = target.new_cache()
    target.forward(cache, HISTORY[:-1], 1)
    rows = target.forward(cache, HISTORY[-1:] + TOKENS, len(TOKENS) + 1, tree=PARENTS)  # (7, V)
    for node in [ROOT] + list(range(len(TOKENS))):
        alone = target.forward(target.new_cache(), HISTORY + chain_of(node), 1)[-1]
        assert np.abs(rows[node + 1] - alone).max() < TOLERANCE, node
    target.keep_path(cache, len(HISTORY), KEPT)
    target.truncate(cache, len(HISTORY) + len(KEPT))
    after = target.forward(cache, [7], 1)[-1]
    alone = target.forward(target.new_cache(), HISTORY + chain_of(KEPT[-1]) + [7], 1)[-1]
    assert np.abs(after - alone).max() < TOLERANCE


def test_a_static_tree_pass_beside_a_chain_pass_scores_each_as_alone(static_target):
    """One forward of two slots, a tree in one and a chain in the other: each gets its own rows."""
    tree_cache, chain_cache = static_target.new_cache(), static_target.new_cache()
    static_target.forward(tree_cache, HISTORY[:-1], 1)
    tree_rows, chain_rows = static_target.forward_many([
        Pass(tree_cache, HISTORY[-1:] + TOKENS, len(TOKENS) + 1, tree=PARENTS),
        Pass(chain_cache, HISTORY + [50, 52], 3)])
    alone = static_target.forward(static_target.new_cache(), HISTORY + [50, 52], 3)
    assert np.abs(chain_rows - alone).max() < TOLERANCE
    for node in range(len(TOKENS)):
        chain_alone = static_target.forward(static_target.new_cache(), HISTORY + chain_of(node), 1)[-1]
        assert np.abs(tree_rows[node + 1] - chain_alone).max() < TOLERANCE, node
