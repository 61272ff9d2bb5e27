"""Users served at a per-user service level: a search over user counts until the level breaks.

The level (`ServiceLevel`): the users' tokens/s over the measured window (paced users: over their
replies, `rates_of`) at `users_percentile`
(default 50: the median user, the "user p50" the benchmark's tables print; 0: every user, so
the slowest) at least `tok_s` (default 30), and the first token's p99 over the replies started
in the window at most `first_token_s` (default 1 s). How fast the slowest user is against the
slowest server-only user is a separate question, asked of every wave (benchmarks/capacity.py
prints both). `search` probes user counts
from `start`, doubling while the level holds (up to `limit`), then halves the gap between the
last count that held and the first that broke `refine` times; the users served are the largest
count that held. Every probe is an emulated wave (benchmarks/capacity.py); its record is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ServiceLevel:
    tok_s: float = 30.0  # the users' tokens/s at `users_percentile` at least
    first_token_s: float = 1.0  # the first token's p99 at most
    users_percentile: float = 50.0  # which user must reach `tok_s`: 50 the median one, 0 every one

    def __post_init__(self) -> None:
        if not 0 <= self.users_percentile <= 100:
            raise ValueError(f"the users' percentile must be 0 (every user) to 100, got {self.users_percentile:g}")

    def user_tok_s(self, record) -> float:
        """The tokens/s of the user at the level's percentile in a wave's record."""
        return percentile(rates_of(record), self.users_percentile)

    def met(self, record) -> bool:
        """Whether a wave's record (capacity.WaveRecord) meets the level; not where no reply began in its
        window (the first token unmeasured: a window shorter than a reply)."""
        return (bool(rates_of(record)) and self.user_tok_s(record) >= self.tok_s and record.first_tokens > 0
                and record.first_token_p99_s <= self.first_token_s and not record.errors)

    def describe(self) -> str:
        users = "every user" if self.users_percentile == 0 else \
            "the median user" if self.users_percentile == 50 else f"the users' p{self.users_percentile:g}"
        return f"{users} >= {self.tok_s:g} tokens/s, first token p99 <= {self.first_token_s:g} s"


def rates_of(record) -> list[float]:
    """Each user's tokens/s as the level reads them: over the window, or, where users were paced (a
    reply every so often, `--reply-every`), over their replies. A paced user is idle between replies:
    over the window it makes a reply's tokens a pace, whatever the service, and every count would
    read as under the level."""
    return record.reply_rates if record.pace_s else record.user_rates


def percentile(values, p: float) -> float:
    """The p-th percentile of `values` by the nearest rank (p 0: the least; 0.0 for none)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


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
