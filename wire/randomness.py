"""What a seed means, on both ends: independent random streams, one per job, keyed by position.

A user's seed S feeds two things that must never share a draw: the drafter's sampling and
the service's decisions. If both drew from one generator seeded with S, the uniform that
accepts draft token i would be the uniform that drew it, and the output would lean towards
what the drafter likes. So each job hashes S with its own domain tag
(`np.random.SeedSequence([S, DOMAIN])`): the two streams are independent by construction.

The drafter's randomness is an ordinary stream (`draft_generator`): it lives in the client,
which never forgets its history.

The service's randomness is a function of what it decides, never of history: the
generator for "decision `what` about the token at absolute position n" is Philox (a
counter-based generator) with the key hashed from (S, DOMAIN_VERIFY) and the counter
(0, what, n, 0). A session rebuilt after a reconnect, a resync, or on another replica
therefore draws exactly the same numbers for the same position, and a seeded run repeats
token for token; a session can never replay the numbers of earlier positions for later
ones. Philox advances the lowest counter word as it draws, so each (what, n) owns 2**64
blocks of four 64-bit outputs before it could touch a neighbour's (one decision draws one).

A seed of None means fresh entropy on each end: the service picks its own seed per session.

One draw is shared on purpose: a streamed generation (Generate, with or without Draft
frames) picks the target's token at position n by an exponential race over the noise
`race(n)` (wire/sampling.py `race_choice`), and a drafter that knows the session's seed
guesses that token by running the same race over its own distribution. That biases
nothing: a guess is kept only where it *equals* the target's own pick, which is a draw from
the target's distribution whatever the drafter guessed, so the guess decides how many
tokens a pass commits, never which. (Rejection sampling, by contrast, accepts a draft token
with a uniform; if that uniform were the one that drew the token, the output would lean
towards the drafter. Hence the independent streams above for verify rounds.)
"""

from __future__ import annotations

import enum

import numpy as np

MAX_SEED = 2**64 - 1  # SeedSequence takes any non-negative int; the wire carries 64 bits
DOMAIN_DRAFT = 0x6472616674  # b"draft": the drafter's sampling
DOMAIN_VERIFY = 0x766572696679  # b"verify": the service's decisions


class Decision(enum.IntEnum):
    """What a service draw decides about a position; each has its own independent stream."""

    ACCEPT = 1  # the uniform that accepts or rejects the draft token there
    TOKEN = 2  # the draw of the service's own token there (residual or bonus of a verify round)
    RACE = 3  # the exponential clocks of every token at that position, in a stream (see above)


def seed_problem(seed: int | None) -> str:
    """What is wrong with a seed from the wire (a Hello's or a Sync's), or ""."""
    if seed is not None and not 0 <= seed <= MAX_SEED:
        return f"seed must be between 0 and 2**64 - 1, got {seed}"
    return ""


def fresh_seed() -> int:
    """A new seed from the operating system's entropy, within what the wire carries."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0])


def draft_generator(seed: int | None) -> np.random.Generator:
    """The drafter's stream for a user's seed (None: fresh entropy)."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, DOMAIN_DRAFT]))


class DecisionRandomness:
    """The service's draws for one session: one generator per (position, decision)."""

    def __init__(self, seed: int | None):
        self.seed = fresh_seed() if seed is None else seed
        self._key = np.random.SeedSequence([self.seed, DOMAIN_VERIFY]).generate_state(2, np.uint64)  # (2,)

    def at(self, position: int, what: Decision) -> np.random.Generator:
        """The generator for decision `what` about the token at absolute position `position`."""
        counter = np.array([0, int(what), position, 0], dtype=np.uint64)  # (4,)
        return np.random.Generator(np.random.Philox(key=self._key, counter=counter))

    def race(self, position: int, vocab_size: int) -> np.ndarray:
        """The race's clocks at absolute `position`: (vocab_size,) independent Exp(1) variates,
        one per token id, the same on the service and on a drafter that knows the seed."""
        return self.at(position, Decision.RACE).standard_exponential(vocab_size)
