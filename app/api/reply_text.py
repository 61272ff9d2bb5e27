"""One reply's committed tokens as the text a client receives: decoded, cut at a stop, counted.

Tokens are taken one at a time, whatever the rounds that committed them, so that where a
stop cuts (and the usage reported) does not depend on how speculation grouped the tokens:
greedy output through the endpoint is the same whichever mode made it. Bytes are decoded
incrementally (a character split across tokens waits for its last byte).
"""

from __future__ import annotations

import codecs
from typing import Callable, Iterable, Sequence

from app.api.stop_strings import StopCutter


class ReplyText:
    def __init__(self, token_bytes: Callable[[int], bytes], end_ids: Iterable[int], stops: Sequence[str]):
        self._token_bytes = token_bytes
        self._end_ids = frozenset(end_ids)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopCutter(stops)
        self.token_ids: list[int] = []  # the reply's tokens, up to the one that completed a stop or ended it
        self.provenance: list[list] = []  # [provenance, count] runs over token_ids
        self.ended = False  # an end token or a stop string came: later tokens are not the reply's
        self.stopped_at_string = False
        self.sent = ""  # what was let through so far

    def add(self, tokens: Sequence[int], provenance: Sequence[str]) -> str:
        """Take a round's tokens; returns the text now safe to send (it may be empty)."""
        pieces = []
        for token, mark in zip(tokens, provenance):
            if self.ended:
                break
            self.token_ids.append(token)
            if self.provenance and self.provenance[-1][0] == mark:
                self.provenance[-1][1] += 1
            else:
                self.provenance.append([mark, 1])
            pieces.append(self._stops.feed(self._decoder.decode(self._token_bytes(token))))
            self.stopped_at_string = self._stops.stopped
            self.ended = self.stopped_at_string or token in self._end_ids
        return self._let_through("".join(pieces))

    def finish(self) -> str:
        """The generation is over: the text still held back (a partial character, a partial stop)."""
        tail = self._stops.feed(self._decoder.decode(b"", final=True))
        return self._let_through(tail + self._stops.flush())

    def count(self, mark: str) -> int:
        return sum(n for each, n in self.provenance if each == mark)

    def _let_through(self, text: str) -> str:
        self.sent += text
        return text
