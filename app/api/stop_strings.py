"""Stop strings cut as OpenAI cuts them: the text up to the first stop, the stop itself left out.

Text is fed as it is generated, one token's text at a time. A stop may be split across
tokens, so text that could be the start of a stop is held back until the next tokens
show whether it is: a stream never sends text that turns out to be part of a stop. The
first stop to appear in the generated text wins; when one token completes several, the
one that starts first (the text up to it is the shortest).
"""

from __future__ import annotations

from typing import Sequence


class StopCutter:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.stopped = False  # a stop string appeared: nothing more is let through
        self._held = ""  # the end of the text so far that is the start of some stop

    def feed(self, text: str) -> str:
        """The part of the text so far that is now sure to come before any stop."""
        if self.stopped:
            return ""
        pending = self._held + text
        # `pending` holds no whole stop before `text`: a stop found now ends inside `text`
        found = [at for at in (pending.find(stop) for stop in self.stops) if at >= 0]
        if found:
            self.stopped, self._held = True, ""
            return pending[: min(found)]
        keep = self._longest_stop_start(pending)
        self._held = pending[len(pending) - keep:]
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """The text held back, at the end of a generation that met no stop."""
        held, self._held = ("" if self.stopped else self._held), ""
        return held

    def _longest_stop_start(self, text: str) -> int:
        """Length of the longest suffix of `text` that some stop begins with (0: none)."""
        longest = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
