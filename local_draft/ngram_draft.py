"""Model-free drafting: propose what followed the context's suffix the last time it occurred.

The context (prompt, earlier turns, the reply so far) is indexed as it grows: for every
n = 1..max_n, the n tokens ending at each position map to the position that followed
them, the most recent occurrence winning. A lookup tries the longest suffix first, so a
proposal costs max_n dictionary look-ups and a committed token max_n updates, whatever
the context's length.

The index follows the context like the draft model's KV cache: `sync(context)` keeps the
longest common prefix and undoes the rest (every update logs the entry it replaced), so a
rejected draft, a new conversation or a /retry costs a roll back, never a rebuild.

A proposal copies the text after the match: token i of the draft is the one i positions
after it, the draft itself continuing the copy when the match is close to the end (a
repeating run keeps repeating). Under sampling the draft is a draw from a point mass on
each proposed token, and that is what is sent as q (`point_mass`): the service's
min(1, p/q) then accepts with probability p(x) and resamples a rejection from p without x,
which is the rejection rule's exact output for this q.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from wire.protocol import SparseDist

MAX_N = 8  # longest suffix matched: past 8 tokens a match says little more about what follows


@dataclass(frozen=True)
class NGramProposal:
    tokens: list[int]
    match_len: int  # n of the longest suffix found earlier in the context (0: none, no tokens)


def point_mass(token: int) -> SparseDist:
    """The draft distribution of a proposed n-gram token: all of its mass on that token."""
    return SparseDist(ids=[token], probs=[1.0])


@dataclass
class NGramDrafter:
    max_n: int = MAX_N
    tokens: list[int] = field(default_factory=list)  # the indexed context
    _follower: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> index of the token after it
    _undo: list[list[tuple[tuple[int, ...], int | None]]] = field(default_factory=list)  # per token: replaced entries

    def __post_init__(self) -> None:
        if self.max_n < 1:
            raise ValueError(f"max_n must be at least 1, got {self.max_n}")

    # ---- the index --------------------------------------------------------------------

    def sync(self, context: Sequence[int]) -> None:
        """Make the index hold exactly `context`: keep the common prefix, undo the rest, add the new."""
        held = len(self.tokens)
        if len(context) >= held and list(context[:held]) == self.tokens:  # the usual case: one compare in C
            common = held
        else:
            common, limit = 0, min(held, len(context))
            while common < limit and self.tokens[common] == context[common]:
                common += 1
        self.rollback(common)
        for token in context[common:]:
            self.append(token)

    def append(self, token: int) -> None:
        """Index one more token: the n-grams that end just before it now lead to it."""
        end = len(self.tokens)  # the new token's position
        replaced = []
        for n in range(1, min(self.max_n, end) + 1):
            key = tuple(self.tokens[end - n:end])
            replaced.append((key, self._follower.get(key)))
            self._follower[key] = end
        self._undo.append(replaced)
        self.tokens.append(token)

    def rollback(self, n_keep: int) -> None:
        """Forget every token from position n_keep on, restoring the entries they replaced."""
        while len(self.tokens) > n_keep:
            self.tokens.pop()
            for key, previous in reversed(self._undo.pop()):
                if previous is None:
                    del self._follower[key]
                else:
                    self._follower[key] = previous

    # ---- drafting ---------------------------------------------------------------------

    def match(self, context: Sequence[int]) -> tuple[int, int]:
        """(n, position): the longest suffix of `context` seen earlier and where its follower is;
        (0, -1) when even the last token is new."""
        self.sync(context)
        end = len(self.tokens)
        # The suffix's own n-grams are indexed only when a token follows them, so any hit is earlier.
        for n in range(min(self.max_n, end), 0, -1):
            position = self._follower.get(tuple(self.tokens[end - n:]))
            if position is not None:
                return n, position
        return 0, -1

    def propose(self, context: Sequence[int], k: int) -> NGramProposal:
        """Up to k tokens that followed the longest earlier occurrence of the context's suffix."""
        n, position = self.match(context)
        if n == 0 or k <= 0:
            return NGramProposal([], n)
        draft: list[int] = []  # the text after the match, continued by the draft itself past the end
        for i in range(k):
            source = position + i
            draft.append(self.tokens[source] if source < len(self.tokens) else draft[source - len(self.tokens)])
        return NGramProposal(draft, n)
