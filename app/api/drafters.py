"""The draft models requests borrow: one request holds a drafter for its whole generation.

A drafter is a llama.cpp context with one KV cache, so two requests cannot draft with it
at once, and handing it over round by round would make each round re-read the other
request's whole context. The rule (measured in docs/openai-api.md): `--drafters N` models
are loaded (default 1); a request takes a free one; a request that finds none free
drafts with the n-gram copy of its context (no model, nothing to wait for) while the
service verifies. Only a request that would run offline (no service) waits for a drafter.
"""

from __future__ import annotations

import threading
from typing import Callable

from local_draft.draft_model import DraftModel


class DrafterPool:
    def __init__(self, drafters: list[DraftModel]):
        self.size = len(drafters)
        self._free = list(drafters)
        self._changed = threading.Condition()

    def try_take(self) -> DraftModel | None:
        """A free drafter, or None at once when all are lent."""
        with self._changed:
            return self._free.pop() if self._free else None

    def take(self, should_stop: Callable[[], bool], poll_s: float = 0.1) -> DraftModel | None:
        """Wait for a free drafter; None if there are none at all or `should_stop` says so first."""
        with self._changed:
            while not self._free:
                if self.size == 0 or should_stop():
                    return None
                self._changed.wait(poll_s)
            return self._free.pop()

    def give_back(self, drafter: DraftModel | None) -> None:
        if drafter is None:
            return
        with self._changed:
            self._free.append(drafter)
            self._changed.notify()

    @property
    def free(self) -> int:
        with self._changed:
            return len(self._free)
