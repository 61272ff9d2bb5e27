"""A stream's drafts: the client's chain of guesses, checked against what the stream committed,
and how many of them the next pass verifies.

While the service streams (Generate), the client drafts ahead of the tokens it has received
and sends its guesses (Draft frames, wire/protocol.py). A chain is anchored where the client
started it: the tokens before `start` are history the client received, so the chain's
guesses continue exactly what the service committed there. By the time a chain arrives the
stream has usually gone further: the guesses for positions the stream has passed are
compared with what it committed (a guess that differs kills the chain: what follows it was
guessed after another text), and the guesses past the stream's end are the pass's block.

A guess the pass keeps is the target's own token there (the session's `stream_work`
compares each with the token the target picks, greedy or by its race: wire/sampling.py), so
what the client sends can change the speed of the stream, never its text. What a pass
should take of the block is a cost question, answered by `best_block` from the device's
measured cost curve and the chain's measured acceptance: on a GPU, where a pass of 16 tokens
costs about one of 1, everything; on a CPU, where each token costs, only what pays.

A Draft may carry a tree of guesses instead (wire/draft_tree.py): the stream follows it down
from its root through the tokens it committed, and the pass's block is what lies below the
node it reached (`pending`): the pass checks every branch of it, where the backend can
(tree attention), else the first-choice path.

`receive` runs on the event loop, `block` and `after_pass` on the device thread: the chain
is replaced whole by `receive` (one assignment), and what the device thread learns about it
(how far it was found right, where it died) only ever grows, so a stale copy is checked again,
never trusted wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from wire.draft_tree import ROOT, GuessTree
from wire.protocol import Draft

MEMORY = 0.9  # weight of the past per tested guess: the acceptance follows a reply from code into prose
PRIOR_ACCEPTANCE = 0.7  # before any guess was tested: a same-family pair on ordinary text
PRIOR_WEIGHT = 2.0  # worth two tested guesses


@dataclass
class DraftChain:
    chain: int  # the client's number for it: a Draft with another number starts a new chain
    start: int  # the absolute position of tokens[0]
    tokens: list[int]
    source: str = ""
    right: int = 0  # tokens[:right] are known to equal the committed history
    dead_at: int | None = None  # index of the first guess found wrong, if any (a tree's: the depth)
    tree: GuessTree | None = None  # a tree's guesses (None: a chain); `start` is then its depth-1 position
    at: int = ROOT  # in a tree: the deepest node known to equal the committed history

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass
class PassSoFar:
    """What the members of a forming pass planned before this one: tokens fed and expected commits."""

    tokens: int = 0
    expected: float = 0.0
    sessions: int = 0
    budget: float = float("inf")  # tokens the whole pass may feed (the queue's batch_tokens)
    share: float = float("inf")  # optional tokens (guesses) each member may add: its even share of the rest
    # the members planned after this one: the tokens they must feed, and how many they are (a token each)
    later_tokens: int = 0
    later_sessions: int = 0
    # Fairness (remote_verify/pass_ledger.py): `plain_s` is c(every member's own tokens, and a token for
    # each further stream server-only would run), the pass as plain streams would run it (None: no constraint); the pass may cost at most 1 + `others_room`
    # times that by the other members' ledgers, and 1 + `own_room` + this member's expected kept
    # guesses by its own (its guesses pay for what they add)
    plain_s: float | None = None
    others_room: float = float("inf")
    own_room: float = float("inf")
    # Members whose reply's first token this pass makes (every member, while a prompt waits to be read in
    # pieces): their least room, against the pass's cost as it is
    first_room: float = float("inf")
    # Under users who leave the passes between replies, a kept guess ends its reply a pass sooner and so
    # frees a stream's place in a later pass (remote_verify/plain_load.py `freed`): the other members' ledgers
    # count the pass's cost less what its kept guesses free, `credit_s` for the members planned so far and
    # `guess_credit_s` for each of this member's (0: no credit; a first token's pass never has any)
    credit_s: float = 0.0
    guess_credit_s: float = 0.0
    # the cost curve of passes of about this many members (remote_verify/pass_costs.py `shared`): what the
    # pass's guesses are priced by (None: the stream's own curve)
    costs: Any = None

    def add(self, share, expected: float) -> None:
        """A member planned: its share of the pass (a backends.Pass) and the tokens it expects to commit."""
        self.tokens += len(share.tokens)
        self.expected += expected
        self.sessions += 1


@dataclass
class StreamDrafts:
    """The drafts of one stream (one Generate): its latest chain and the acceptance of its guesses."""

    seq: int  # the Generate they belong to
    chain: DraftChain | None = None
    _accepted: float = PRIOR_ACCEPTANCE * PRIOR_WEIGHT  # decayed accepted guesses
    _tested: float = PRIOR_WEIGHT  # decayed tested guesses
    counted_upto: int = field(default=0)  # positions below this were counted in the acceptance

    @property
    def acceptance(self) -> float:
        """The chance that a guess is right when the ones before it were (decayed mean)."""
        return min(self._accepted / self._tested, 0.995)

    def receive(self, draft: Draft) -> str:
        """Take a Draft (event loop); returns "" or why it was not taken (a chain with a gap)."""
        if draft.seq != self.seq:
            return ""  # a stream that has ended: nothing to verify against
        current = self.chain
        if draft.parents:  # a tree is taken whole (its shape was checked: wire/draft_tree.py)
            self.chain = DraftChain(draft.chain, draft.start, list(draft.tokens), draft.source,
                                    tree=GuessTree(list(draft.tokens), list(draft.parents)))
        elif current is not None and current.tree is None and draft.chain == current.chain:
            if not current.start <= draft.start <= current.end:
                return (f"draft chain {draft.chain} continued at position {draft.start}, outside its "
                        f"positions {current.start}..{current.end}: start a new chain")
            kept = draft.start - current.start
            dead_at = current.dead_at if current.dead_at is not None and current.dead_at < kept else None
            self.chain = DraftChain(current.chain, current.start, current.tokens[:kept] + list(draft.tokens),
                                    draft.source or current.source, right=min(current.right, kept), dead_at=dead_at)
        else:
            self.chain = DraftChain(draft.chain, draft.start, list(draft.tokens), draft.source)
        return ""

    def block(self, committed: list[int]) -> tuple[list[int], str]:
        """The chain's guesses past the committed history, and who drafted them (device thread).

        Guesses for positions already committed are compared with what was committed first;
        a chain that differs there gives nothing (and is remembered dead)."""
        guesses, source = self.pending(committed)
        return guesses.tokens, source

    def pending(self, committed: list[int], limit: int | None = None) -> tuple[GuessTree, str]:
        """The guesses past the committed history, as a tree (a chain's: a chain, of at most `limit`
        guesses: a chain may be as long as the context), and who drafted them."""
        chain = self.chain
        if chain is None or chain.dead_at is not None or chain.start > len(committed):
            return GuessTree([], []), ""
        if chain.tree is not None:
            return self._tree_below(chain, committed), chain.source
        passed = min(len(committed), chain.end) - chain.start  # guesses for committed positions
        while chain.right < passed:
            position = chain.start + chain.right
            if chain.tokens[chain.right] != committed[position]:
                chain.dead_at = chain.right
                self._count(position, False)
                return GuessTree([], []), ""
            self._count(position, True)
            chain.right += 1
        return GuessTree.chain(chain.tokens[passed:passed + limit if limit is not None else None]), chain.source

    def _tree_below(self, chain: DraftChain, committed: list[int]) -> GuessTree:
        """A tree's guesses below the node that the committed history reaches; none once the
        history took a token that no child guessed (the tree is then dead)."""
        tree, node = chain.tree, chain.at
        depth = 0 if node == ROOT else tree.depths[node]
        while chain.start + depth < len(committed):  # the children of `node` guessed a committed position
            position = chain.start + depth
            if not tree.has_children(node):
                return GuessTree([], [])  # the tree ends before the history does
            child = tree.child_with(node, committed[position])
            self._count(position, child is not None)
            if child is None:
                chain.dead_at = depth
                return GuessTree([], [])
            node, depth = child, depth + 1
            chain.at = node
        return tree.below(node)

    def after_pass(self, position: int, block: list[int], accepted: int) -> None:
        """A pass verified `block` at `position` and kept `accepted` guesses (device thread)."""
        for i in range(min(accepted + 1, len(block))):
            self._count(position + i, i < accepted)
        chain = self.chain
        if chain is not None and chain.start <= position <= chain.end and accepted < len(block):
            # a guess was refused here: the rest of this chain continues a text that is not the stream's
            if chain.tokens[position - chain.start: position - chain.start + len(block)] == block:
                chain.dead_at = position - chain.start + accepted

    def after_tree_pass(self, position: int, accepted: int, refused: bool) -> None:
        """A pass walked a tree at `position` and kept `accepted` guesses; `refused`: the node it
        stopped at had children, none of which was the target's pick (device thread)."""
        for i in range(accepted + refused):
            self._count(position + i, i < accepted)

    def _count(self, position: int, right: bool) -> None:
        """One tested guess, counted once per position (a position is tested once, as passed or in a pass)."""
        if position < self.counted_upto:
            return
        self.counted_upto = position + 1
        self._accepted = self._accepted * MEMORY + (1.0 if right else 0.0)
        self._tested = self._tested * MEMORY + 1.0


def tree_chances(tree: GuessTree, acceptance: float) -> list[float]:
    """The chance that each node of `tree` is kept, from the chain's acceptance: a first child is
    right with the chance a chain's guess is, and the other children share what it leaves, at
    that acceptance again (a second guess is right about as often as a first where the first
    was wrong); a node is kept if its parent was and it is right."""
    chances = []
    for i, parent in enumerate(tree.parents):
        siblings = tree.children(parent)
        right = acceptance if siblings[0] == i else (1 - acceptance) * acceptance / (len(siblings) - 1)
        chances.append(right * (chances[parent] if parent != ROOT else 1.0))
    return chances


def best_block(available: int, acceptance: float, seconds, unrun: int, so_far: PassSoFar,
               chances: Sequence[float] | None = None) -> int:
    """How many of `available` guesses the pass verifies (0..available).

    The objective is the pass's committed tokens per second of device time, every member's:
    (so_far.expected + later + 1 + E[accepted guesses]) / c(so_far.tokens + unrun + b + later tokens), where the i-th
    guess is kept with probability acceptance**i (each only if the ones before it were) and
    c is the device's measured cost curve (`seconds(n)`, None while unmeasured: then every
    guess is taken). One session alone maximises its own rate; in a shared pass, a guess is
    taken only if it raises the rate of the whole pass, so blocks shrink where the device is
    bound by its arithmetic, and not where a pass costs the same for 1 or 100 tokens.
    `chances[i]`, where given, is the chance that guess i is kept (a tree's: `tree_chances`);
    a tree's first guesses are a tree, so the pass takes a prefix of its nodes.

    Fairness bounds it (`so_far.plain_s`): no block makes the pass cost more over the plain pass
    than the other members' rooms allow, nor more than this member's own room and its expected
    kept guesses pay for: a member never runs slower than it would as a plain stream, beyond the
    small deficit its ledger allows (remote_verify/pass_ledger.py).
    """
    if available <= 0 or seconds(1) is None:
        return max(available, 0)
    best, best_rate = 0, -1.0
    expected, chance = 0.0, 1.0
    others = so_far.later_tokens
    for b in range(available + 1):
        if b:
            chance = chance * acceptance if chances is None else chances[b - 1]
            expected += chance
        cost = seconds(so_far.tokens + unrun + b + others)
        if b and so_far.plain_s:
            if cost / so_far.plain_s - 1.0 > so_far.first_room + 1e-9:
                break  # a first token's pass, as it is: costs only grow with b
            # what every member's pass costs over the plain one, less the later passes its kept guesses free
            extra = (cost - so_far.credit_s - expected * so_far.guess_credit_s) / so_far.plain_s - 1.0
            if extra > so_far.others_room + 1e-9:
                continue  # (a longer block may free more than it costs)
            if extra > so_far.own_room + expected + 1e-9:
                continue  # its own guesses do not pay for it yet (a longer block may)
        rate = (so_far.expected + so_far.later_sessions + 1.0 + expected) / max(cost, 1e-9)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = b, rate
    return best
