"""A tree of guesses: draft tokens with parent indices, as a Draft frame carries them.

Node i guesses the token after its parent (`parents[i]`, an earlier node, or -1: the token
before the tree), so a node at depth d (children of -1 are at depth 1) guesses the token at
position start + d - 1. A chain is the tree whose parents are -1, 0, 1, ...; the empty
parent list of a Draft means that chain. Nodes come parents first, so every prefix of a
tree's nodes is a tree: a pass that has room for only some of them takes the first ones.

Both ends use this module: the client to build a tree (`GuessTree`, `tree_problem` before
sending), the service to check it, find the part of it past what the stream committed, and
walk it by the target's picks (`walk`). Pure Python over short lists: no numpy, the client
stays light.
"""

from __future__ import annotations

from typing import Callable, Sequence

from wire.limits import MAX_TREE_DEPTH, MAX_TREE_NODES, MAX_TREE_WIDTH

ROOT = -1  # the parent of a tree's first guesses: the token before the tree


def tree_problem(parents: Sequence[int], n_tokens: int) -> str:
    """What is wrong with a Draft's tree ("" if nothing): one parent per token, each an earlier
    node or ROOT, and within MAX_TREE_NODES nodes, MAX_TREE_DEPTH deep, MAX_TREE_WIDTH children
    of one node. An empty `parents` is a chain and always fine here."""
    if not parents:
        return ""
    if len(parents) != n_tokens:
        return f"a tree has one parent per token: got {len(parents)} parents for {n_tokens} tokens"
    if n_tokens > MAX_TREE_NODES:
        return f"a tree of {n_tokens} nodes is over the limit of {MAX_TREE_NODES}"
    depths: list[int] = []
    children = [0] * (n_tokens + 1)  # children[p + 1]: children of node p (of ROOT at 0)
    for i, parent in enumerate(parents):
        if not ROOT <= parent < i:
            return (f"node {i} has parent {parent}: a parent is an earlier node, or {ROOT} for the "
                    "token before the tree")
        depth = 1 if parent == ROOT else depths[parent] + 1
        if depth > MAX_TREE_DEPTH:
            return f"node {i} is {depth} deep, over the limit of {MAX_TREE_DEPTH}"
        children[parent + 1] += 1
        if children[parent + 1] > MAX_TREE_WIDTH:
            return f"node {parent} has more than {MAX_TREE_WIDTH} children, over the limit"
        depths.append(depth)
    return ""


class GuessTree:
    """A checked tree of guesses (`tree_problem` is "" for it), with what a walk needs.

    A chain (every parent the node before) takes shortcuts: a stream's every pass handles one,
    on the device thread between two passes, and a chain needs no index of children."""

    def __init__(self, tokens: list[int], parents: list[int], chain: bool | None = None):
        self.tokens = tokens
        self.parents = parents
        self._chain = chain
        self._depths: list[int] | None = None
        self._children: dict[int, list[int]] | None = None

    def __repr__(self) -> str:
        return f"GuessTree(tokens={self.tokens}, parents={self.parents})"

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> GuessTree:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), chain=True)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        if self._chain is None:
            self._chain = self.parents == list(range(-1, len(self.parents) - 1))  # compared in C: asked of every new tree
        return self._chain

    @property
    def depths(self) -> list[int]:
        """Each node's depth: 1 for the children of ROOT."""
        if self._depths is None:
            self._depths = []
            for parent in self.parents:
                self._depths.append(1 if parent == ROOT else self._depths[parent] + 1)
        return self._depths

    def children(self, node: int) -> list[int]:
        """The children of `node` (or of ROOT), in node order."""
        if self.is_chain:
            return [node + 1] if node + 1 < len(self.tokens) else []
        if self._children is None:
            self._children = {}
            for i, parent in enumerate(self.parents):
                self._children.setdefault(parent, []).append(i)
        return self._children.get(node, [])

    def child_with(self, node: int, token: int) -> int | None:
        """The first child of `node` (or of ROOT) that guessed `token`, or None."""
        if self.is_chain or self._children is not None:
            return next((child for child in self.children(node) if self.tokens[child] == token), None)
        # Without building the index of children: a stream's tree is walked a few nodes a pass, and a
        # client re-sends its tree as it grows, so a new tree of up to MAX_TREE_NODES was indexed whole for
        # each member of nearly every pass (at 128 users on the emulated 70B, about half the device thread's
        # time between passes). A node's children come after it (parents first), found by the list's own search.
        child = node
        while True:
            try:
                child = self.parents.index(node, child + 1)
            except ValueError:
                return None
            if self.tokens[child] == token:
                return child

    def has_children(self, node: int) -> bool:
        """Whether `node` (or ROOT) has a child, without indexing the tree (`child_with` says why)."""
        if self.is_chain or self._children is not None:
            return bool(self.children(node))
        return node in self.parents[max(node, 0):]  # ROOT's children start at node 0; a node's after it

    def first_choice_path(self) -> list[int]:
        """The nodes of the chain of first children from ROOT: what a backend without tree
        attention verifies."""
        path, node = [], ROOT
        while self.children(node):
            node = self.children(node)[0]
            path.append(node)
        return path

    def below(self, node: int) -> GuessTree:
        """The descendants of `node` as a tree of their own (`node` becomes its ROOT), in node order."""
        if node == ROOT:
            return self
        if self.is_chain:
            return GuessTree.chain(self.tokens[node + 1:])
        index = {node: ROOT}
        tokens, parents = [], []
        for i in range(node + 1, len(self.tokens)):
            if self.parents[i] in index:
                index[i] = len(tokens)
                tokens.append(self.tokens[i])
                parents.append(index[self.parents[i]])
        return GuessTree(tokens, parents)

    def pruned(self, max_nodes: int, max_depth: int, stops: frozenset[int] = frozenset()) -> GuessTree:
        """The first nodes of the tree, at most `max_nodes` of them and `max_depth` deep, without the
        descendants of a stop token (what would follow a stop is never sent)."""
        if self.is_chain:
            kept = self.tokens[:max(0, min(max_nodes, max_depth))]
            if stops and not stops.isdisjoint(kept):
                kept = kept[:next(i for i, token in enumerate(kept) if token in stops) + 1]
            return self if len(kept) == len(self.tokens) else GuessTree.chain(kept)
        index: dict[int, int] = {ROOT: ROOT}
        tokens, parents = [], []
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            if len(tokens) >= max_nodes:
                break
            if parent not in index or self.depths[i] > max_depth:
                continue
            if parent != ROOT and self.tokens[parent] in stops:
                continue
            index[i] = len(tokens)
            tokens.append(token)
            parents.append(index[parent])
        return GuessTree(tokens, parents)

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[node] for node in path]

    def tokens_to(self, node: int) -> list[int]:
        """The tokens from ROOT down to `node`, itself included (none for ROOT): the text that the
        pass row after `node` continues."""
        if self.is_chain:
            return self.tokens[:node + 1]
        tokens = []
        while node != ROOT:
            tokens.append(self.tokens[node])
            node = self.parents[node]
        return tokens[::-1]


def walk(tree: GuessTree, pick: Callable[[int, int], int],
         stops: frozenset[int] = frozenset()) -> tuple[list[int], int | None]:
    """The nodes the target keeps, from the root down, and its own token after the last of them.

    `pick(row, depth)` is the target's token after the node whose pass row is `row` (0: the
    token before the tree, i + 1: node i), which sits `depth` nodes below that token. At each
    node the target's pick is taken, and the child that guessed it is kept; none did: the walk
    ends, and the pick is the target's own token. A chain walks as it always has: row = depth.
    A kept stop token ends the text: nothing is picked after it (None), as nothing may follow it
    (a grammar has no state past its end)."""
    path, node = [], ROOT
    while True:
        token = pick(node + 1, len(path))
        child = tree.child_with(node, token)
        if child is None:
            return path, token
        path.append(child)
        node = child
        if tree.tokens[child] in stops:
            return path, None
