"""A record of every shared pass and of every reply's first token, one JSON object a line.

`specwire serve --trace-passes FILE` writes it; benchmarks/pass_trace_report.py reads it. Where a reply's
first token goes (the pass that was running when its request came, the passes it waited out, the pass
that made it) is the question every first-token figure of docs/results.md came down to, and a client
sees only the sum.

Each line is one of:
- `{"pass": began, "s": seconds, "members": n, "tokens": fed, "own": tokens the members had to feed,
  "budget": the pass's token budget, "plain_s": the ledger's plain pass (null without fair passes or
  alone), "first": [[session, prompt tokens, arrived], ...]}`: a shared pass; `first` holds each member
  whose reply's first token this pass made (its prompt's last piece), `arrived` when its request reached
  the queue (a stream's start, where it has one);
- `{"opened": t}`: the first line, when the file was opened;
- `{"window": [start, end], "mode": ..., "users": ...}`: a benchmark's measured window, written by
  `benchmarks.load --trace-passes` (benchmarks/pass_trace_report.py `mark_window`), not by the service.

Times are seconds on the service's monotonic clock (time.perf_counter). Sessions are the queue's keys.
Written on the device thread, a line a pass (a few microseconds), and only when asked for.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Hashable


class PassTrace:
    """Appends a service's passes to `path` (created, or added to)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = self.path.open("a", buffering=1, encoding="utf-8")  # a line at a time: readable while it runs
        self._write({"opened": time.perf_counter()})

    def shared_pass(self, began: float, seconds: float, members: int, tokens: int, own: int, budget: float,
                    plain_s: float | None, first: list[tuple[Hashable, int, float]]) -> None:
        self._write({"pass": began, "s": seconds, "members": members, "tokens": tokens, "own": own,
                     "budget": None if budget == float("inf") else budget, "plain_s": plain_s,
                     "first": [[str(session), prompt, arrived] for session, prompt, arrived in first]})

    def close(self) -> None:
        self._file.close()

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
