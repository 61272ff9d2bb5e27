"""The client's tree of guesses in the default mode: grown a level at a time, sent whole.

Where the service verifies trees (its Welcome says `trees`) and the stream controller finds that a
tree of w branches pays (local_draft/stream_controller.py `width`), the stream speculator guesses
a tree instead of a chain. Each level decodes the open leaves together (the draft model's
`branch_guesses`: one batch of sequences) and gives each its first choice, and where the drafter
is unsure of it (its chance below BRANCH_BELOW: greedy, the drafter's probability; sampled, the race's
chance that the target picks it, local_draft/draft_model.py RACE_SPREAD) its alternatives beside it,
those with a chance of at least ALTERNATE_ABOVE. The next level grows the `width` likeliest leaves of the whole tree
(the path's probability, the product of the drafter's along it), wherever they are: the tree
splits where the drafter hesitates, stays a chain where it does not, and a branch left behind
grows again once it is likelier than the deepest leaves (SpecExec's best-first choice, a level
of `width` leaves at a time). That also keeps the tree growing after the stream took a branch
whose leaves had been left: a tree that could not grow there waited for the stream to pass its
end, then a round trip for a new one. A whole tree replaces the one before it at the
service (wire/protocol.py `Draft`), which follows it through what it commits, so it is sent again
only when it grew; its likeliest nodes first, as a pass short of room takes the first ones.

Two bounds shape the growth. Leaves at the stream controller's horizon wait while the shallower
ones grow (`limit`): the drafter widens the tree below it rather than idling. A tree at
MAX_TREE_NODES drops its least likely leaves to make room for likelier nodes (`_prune`); it
stopped growing there, with alternatives never grown filling it, and over a long round trip the
stream then ran past its end.

As the stream commits tokens the tree is followed from its root: where every committed token
is a child of the node before it, the subtree below becomes the tree, anchored after them; a
token no child guessed ends it, and a new one starts after the text. Nodes come parents first
(level by level), as a Draft's must (wire/draft_tree.py).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from wire.draft_tree import ROOT
from wire.limits import MAX_TREE_DEPTH, MAX_TREE_NODES

# A first choice the drafter gives less than this gets its alternatives beside it. The drafter's
# probability is about its chance of being right (Leviathan et al.: acceptance tracks the draft's
# confidence; the default pair's drafter is right at 0.99 where it says 0.9 or more, at 0.60 below
# 0.8, where 254 of its 277 misses on the recorded paths are), so above this a branch rarely catches
# anything; the width caps the rest.
BRANCH_BELOW = 0.8
# An alternative the drafter gives less than this is not added. Of the default pair's 284 misses on
# the recorded paths the second choice catches 159 and the third 42; in prose the target's token is
# often the drafter's fourth to eighth, at 0.02 to 0.11 (local_draft/draft_model.py BRANCH_CHOICES):
# on the emulated 70B at 14 ms, alternatives down to 0.02 made trees 1.28x chains against 1.26x at
# 0.05 (the same replies, one run); a node costs the pass little there, and the width caps growth.
ALTERNATE_ABOVE = 0.02
# A leaf grows beside the likeliest one only while its path is at least this likely against that
# leaf's: a level of b branches costs the drafter more than one (on a GPU, 8 for 1.6x), and where the
# drafter is sure a chain's level is the cheapest way deeper, which a stream needs as much as width
# (the emulated 70B at 14 ms, trees of 8: 1.27x chains at 0.05, 1.30x at 0.2, 1.27x at 0.5).
OPEN_RATIO = 0.2


class Followed(NamedTuple):
    """What a frame's committed tokens found in a tree, followed from its root."""

    right: int  # tokens that were a child of the node before them
    first: int  # ... of those, first choices
    alternate: int  # ... and alternatives
    tested: int  # tokens tested: `right`, and one more where no child guessed it
    # alternatives taken whose node had a child the service held (an alternative left a leaf ends the
    # stream's guesses there, as a miss does, until the client's next tree arrives)
    carried: int = 0


@dataclass
class DraftTree:
    number: int  # the service tells drafts apart by it
    start: int  # position of the first level's guesses: the received history's length
    width: int  # most leaves grown together (the stream controller's choice)
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)  # 0: the node is its parent's first choice, 1: the second
    chance: list[float] = field(default_factory=list)  # the drafter's probability of the path to the node
    open: list[int] = field(default_factory=lambda: [ROOT])  # leaves grown at the next level
    sent: int = 0  # tokens[:sent] are at the service (the tree is resent whole when it grew)
    sources: list[str] = field(default_factory=list)  # "model" for every node (as a chain's record)
    _grown: set = field(default_factory=set)  # nodes (ROOT too) whose children were added
    wanted: int = 1  # leaves likely enough to grow at the next level, before the width capped them
    depth_limit: int = MAX_TREE_DEPTH  # leaves this deep wait (the stream controller's horizon)
    depths: list[int] = field(default_factory=list)  # each node's depth below the root (1: the first level)

    @property
    def levels(self) -> int:
        """How deep the tree reaches (the chain's length, for a chain): its deepest open leaf's depth
        (a leaf that is grown next is the deepest there is, or close: nodes come a level at a time)."""
        return max((self._depth(node) for node in self.open if node != ROOT), default=0) if self.tokens else 0

    def _depth(self, node: int) -> int:
        depth = 0
        while node != ROOT:
            node, depth = self.parents[node], depth + 1
        return depth

    def path(self, node: int) -> tuple[int, ...]:
        """The guesses from the root down to `node` (ROOT: none)."""
        out = []
        while node != ROOT:
            out.append(self.tokens[node])
            node = self.parents[node]
        return tuple(reversed(out))

    def open_paths(self) -> list[tuple[int, ...]]:
        return [self.path(node) for node in self.open]

    def grow(self, candidates: list[list[tuple[int, float]]], end_ids: frozenset[int]) -> int:
        """Add a level below the open leaves: `candidates[i]` are the drafter's (token, probability),
        best first, after open leaf i. Returns the nodes added and kept (0: nothing more to grow)."""
        before = len(self.tokens)
        for leaf, options in zip(self.open, candidates):
            self._grown.add(leaf)
            base = 1.0 if leaf == ROOT else self.chance[leaf]
            unsure = self.width > 1 and options[0][1] < BRANCH_BELOW
            for rank, (token, p) in enumerate(options if unsure else options[:1]):
                if rank and p < ALTERNATE_ABOVE:
                    break
                self.tokens.append(token)
                self.parents.append(leaf)
                self.rank.append(rank)
                self.chance.append(base * p)
                self.depths.append(1 if leaf == ROOT else self.depths[leaf] + 1)
                self.sources.append("model")
        kept = self._prune(MAX_TREE_NODES, before)
        # none kept: the level was less likely than every leaf of a full tree, as the levels below the
        # leaves not grown yet would be (they are less likely still): full until the stream moves on
        self.open = self._likeliest_leaves(end_ids) if kept else []
        return kept

    def _prune(self, most: int, born_from: int) -> int:
        """Keep at most `most` nodes, dropping the least likely leaves first (a node's children go
        before it, as none is likelier than its parent). A full tree stopped growing where it stood:
        alternatives at every unsure level, most of them never grown, filled it, and over a long
        round trip the stream passed its end before the client heard where it went (the emulated 70B
        at 100 ms: a tree of 8 full at 22 levels, the stream running a token a pass past it). Returns
        how many of the nodes from `born_from` on were kept."""
        if len(self.tokens) <= most:
            return len(self.tokens) - born_from
        children = Counter(self.parents)
        by_chance = lambda node: (self.chance[node], -node)  # noqa: E731 (least likely first; later first at a tie)
        candidates = sorted((node for node in range(len(self.tokens)) if node not in children), key=by_chance)
        drop: set[int] = set()
        while len(self.tokens) - len(drop) > most and candidates:
            node = candidates.pop(0)
            drop.add(node)
            parent = self.parents[node]
            children[parent] -= 1
            if parent != ROOT and children[parent] == 0:  # its parent is a leaf now, in its place by chance
                bisect.insort(candidates, parent, key=by_chance)
        keep = [node for node in range(len(self.tokens)) if node not in drop]
        index = {old: new for new, old in enumerate(keep)}
        index[ROOT] = ROOT
        self.tokens = [self.tokens[node] for node in keep]
        self.parents = [index[self.parents[node]] for node in keep]
        self.rank = [self.rank[node] for node in keep]
        self.chance = [self.chance[node] for node in keep]
        self.depths = [self.depths[node] for node in keep]
        self.sources = [self.sources[node] for node in keep]
        self._grown = {index[node] for node in self._grown if node in index}
        self.sent = sum(1 for node in keep if node < self.sent)  # order is kept: still a prefix
        return sum(1 for node in keep if node >= born_from)

    def limit(self, depth: int, end_ids: frozenset[int]) -> None:
        """Grow no leaf `depth` deep or deeper (the horizon: guesses further ahead would arrive too early
        to be likely reached). The leaves below it go on growing: where the likeliest branch reached the
        horizon the tree widens below it instead of waiting, so that an alternative the stream may take
        has guesses below it (over a long round trip the stream runs on them until the client hears)."""
        if depth != self.depth_limit:
            self.depth_limit = depth
            self.open = self._likeliest_leaves(end_ids) if self.tokens else [ROOT] if depth > 0 else []

    def _likeliest_leaves(self, end_ids: frozenset[int]) -> list[int]:
        """The `width` likeliest nodes not grown yet (nothing follows an end token; none at the depth
        limit), those at least OPEN_RATIO as likely as the first, in node order."""
        leaves = sorted((node for node in range(len(self.tokens))
                         if node not in self._grown and self.tokens[node] not in end_ids
                         and self.depths[node] < self.depth_limit),
                        key=lambda node: -self.chance[node])
        likely = [node for node in leaves if self.chance[node] >= OPEN_RATIO * self.chance[leaves[0]]] if leaves else []
        self.wanted = len(likely)  # what a level costs the drafter depends on it (stream_controller.level_cost)
        return sorted(likely[:self.width])

    def likeliest_first(self) -> tuple[list[int], list[int]]:
        """The tree as a Draft carries it: (tokens, parents) with the likeliest nodes first. A pass
        with room for only some nodes takes the first ones (wire/draft_tree.py), so those should be
        the ones most likely kept; parents still come first, as a child is never likelier than its
        parent (and an equally likely one was added after it)."""
        order = sorted(range(len(self.tokens)), key=lambda node: (-self.chance[node], node))
        place = {node: i for i, node in enumerate(order)}
        return ([self.tokens[node] for node in order],
                [ROOT if self.parents[node] == ROOT else place[self.parents[node]] for node in order])

    def follow(self, committed: list[int]) -> Followed:
        """Follow committed tokens down from the root: how far the tree guessed them (`Followed`)."""
        node, right, first, carried = ROOT, 0, 0, 0
        children = self._children()
        for token in committed:
            kids = children.get(node, [])
            if not kids:
                return Followed(right, first, right - first, right, carried)
            child = next((kid for kid in kids if self.tokens[kid] == token), None)
            if child is None:
                return Followed(right, first, right - first, right + 1, carried)
            if self.rank[child]:  # an alternative: the service could go on below it only if it held a child
                carried += any(kid < self.sent for kid in children.get(child, []))
            right, first, node = right + 1, first + (self.rank[child] == 0), child
        return Followed(right, first, right - first, right, carried)

    def below(self, right: int, committed: list[int], number: int, end_ids: frozenset[int]) -> DraftTree | None:
        """The subtree below the node that `right` committed tokens reach, as a tree anchored after
        them (None when it is empty); it keeps `number` if the service holds all of this tree."""
        node = ROOT
        children = self._children()
        for token in committed[:right]:
            node = next(kid for kid in children[node] if self.tokens[kid] == token)
        index = {node: ROOT}
        rest = DraftTree(number if self.sent == len(self.tokens) else -1, self.start + right, self.width, open=[])
        for i in range(node + 1, len(self.tokens)):
            if self.parents[i] in index:
                index[i] = len(rest.tokens)
                rest.tokens.append(self.tokens[i])
                rest.parents.append(index[self.parents[i]])
                rest.rank.append(self.rank[i])
                rest.chance.append(self.chance[i])
                rest.depths.append(self.depths[i] - right)
                rest.sources.append("model")
        if not rest.tokens:
            return None
        # a leaf grown whose children a full tree dropped (`_prune`) grows again: the subtree has room
        with_children = set(rest.parents)
        rest._grown = {index[grown] for grown in self._grown if grown in index and index[grown] in with_children}
        rest.open = rest._likeliest_leaves(end_ids)  # the likeliest of the subtree's leaves, the left ones too
        rest.sent = len(rest.tokens) if rest.number >= 0 else 0
        return rest

    def _children(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(self.parents):
            children.setdefault(parent, []).append(i)
        return children
