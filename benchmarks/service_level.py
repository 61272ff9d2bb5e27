"""Users served at a per-user service level: a search over user counts until the level breaks.

The level (`ServiceLevel`): every user's tokens/s over the measured window at least `tok_s`
(default 30: each user's own rate, so the slowest user's), and the first token's p99 over the
replies started in the window at most `first_token_s` (default 1 s). `search` probes user counts
from `start`, doubling while the level holds (up to `limit`), then halves the gap between the
last count that held and the first that broke `refine` times; the users served are the largest
count that held. Every probe is an emulated wave (benchmarks/capacity.py); its record is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ServiceLevel:
    tok_s: float = 30.0  # each user's tokens/s at least
    first_token_s: float = 1.0  # the first token's p99 at most

    def met(self, record) -> bool:
        """Whether a wave's record (capacity.WaveRecord) meets the level; not where no reply began in its
        window (the first token unmeasured: a window shorter than a reply)."""
        return (record.user_min_tok_s >= self.tok_s and record.first_tokens > 0
                and record.first_token_p99_s <= self.first_token_s and not record.errors)

    def describe(self) -> str:
        return f"every user >= {self.tok_s:g} tokens/s, first token p99 <= {self.first_token_s:g} s"


def search(probe: Callable[[int], object], level: ServiceLevel, start: int = 4, limit: int = 256,
           refine: int = 2) -> tuple[int, list]:
    """(users served, every probe's record in the order run); 0 when even `start` users break the level."""
    records, good, bad = [], 0, None
    users = start
    while users <= limit:
        record = probe(users)
        records.append(record)
        if level.met(record):
            good = users
            users *= 2
        else:
            bad = users
            break
    if bad is None:
        return good, records
    low = good if good else 0
    for _ in range(refine):
        middle = (low + bad) // 2
        if middle <= low or middle >= bad or middle < 1:
            break
        record = probe(middle)
        records.append(record)
        if level.met(record):
            low = middle
        else:
            bad = middle
    return low, records
