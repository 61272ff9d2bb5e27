"""A wave's emulated users: what they are made of, and what each one does.

A `UserSetup` names their parts, the drafter profile, the recording and the vocabulary (it pickles, so
a worker process of benchmarks/client_processes.py builds its own users from it); `Users` is what it
loads: one vocabulary-only draft model for every user, the recording's prompts, and a fresh emulated
drafter for each user. `run_user` is one user: a real client in the mode named, reply after reply,
each checked against the target's recorded path, kept in its `UserRecord`. Here, not in
benchmarks/capacity.py, so that the worker processes and the benchmark both import it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.emulation.drafter import EmulatedDraft
from benchmarks.emulation.profiles import load_drafter_profile
from benchmarks.emulation.recording import Recording, thinned
from wire.protocol import SamplingParams

# chain: the default mode with trees off; trees2 / trees4 / trees8: with every tree that wide (the
# controller's choice between trees and chains bypassed, to compare shapes); trees16 / trees32: wider
# than any drafter profile measures (the batch cost continued along its last slope), for bounds beside the
# free-branches-0.5b profile
PINNED_TREE_MODES = {"trees2": 2, "trees4": 4, "trees8": 8, "trees16": 16, "trees32": 32}
MODES = ("default", "chain", *PINNED_TREE_MODES, "server", "rounds", "k0")


@dataclass(frozen=True)
class UserSetup:
    drafter_profile: str
    recording_path: Path
    vocab_path: Path  # the GGUF of the recording's vocabulary
    kinds: tuple[str, ...]  # the prompt kinds the users ask
    time_scale: float
    thin_acceptance: float | None = None  # the drafters' guesses thinned to this first-guess acceptance

    def load(self) -> "Users":
        return Users(self)


class Users:
    def __init__(self, setup: UserSetup) -> None:
        from local_draft.draft_model import DraftModel

        self.setup = setup
        self.drafter = load_drafter_profile(setup.drafter_profile)
        self.recording = Recording.load(setup.recording_path)
        self.entries = [entry for entry in self.recording.entries if entry.kind in setup.kinds]
        # the drafters' guesses, thinned to a small drafter's acceptance against a large target (the target's
        # paths, which the service replays, are the same); thinning is seeded, so every process thins alike
        self.guessed = self.recording if setup.thin_acceptance is None else thinned(self.recording,
                                                                                    setup.thin_acceptance)
        self.vocab = DraftModel(setup.vocab_path, vocab_only=True)  # one vocabulary for every user
        # its fingerprint and end tokens read once, here: every user's thread asks for them at its start, and
        # 128 threads reading 151,936 token texts at once each (nothing cached yet) held a wave's start for minutes
        self.vocab.vocab_fingerprint, self.vocab.end_ids

    def draft(self) -> EmulatedDraft:
        """A new user's drafter."""
        return EmulatedDraft(self.vocab, self.drafter, self.guessed, self.setup.time_scale)


@dataclass
class UserRecord:
    commits: list[tuple[float, int]] = field(default_factory=list)  # (time.perf_counter, tokens) as committed
    first_token_s: list[float] = field(default_factory=list)  # of replies started in the window
    first_token_replies: list[int] = field(default_factory=list)  # their reply numbers, in the same order
    passes: int = 0
    tokens: int = 0  # in finished replies (for passes per token)
    drafted: int = 0
    accepted: int = 0
    differing: list[str] = field(default_factory=list)
    error: str | None = None
    accepted_at: list[int] = field(default_factory=list)  # passes keeping at least i + 1 guesses
    drafting_passes: int = 0  # passes that verified a guess
    width: int = 1  # the tree's branches the controller chose last (1: a chain)
    replies: list[tuple[int, float, int]] = field(default_factory=list)  # (reply number, wall s, tokens), finished

    def reply_rate(self) -> float | None:
        """Tokens over wall seconds of its finished replies begun in the window (None: none)."""
        began = set(self.first_token_replies)
        walls = [(wall, tokens) for k, wall, tokens in self.replies if k in began]
        wall = sum(w for w, _ in walls)
        return sum(t for _, t in walls) / wall if wall > 0 else None

    def add_depths(self, stats) -> None:
        self.drafting_passes += stats.drafted_per_position[0] if stats.drafted_per_position else 0
        self.accepted_at.extend([0] * (len(stats.accepted_per_position) - len(self.accepted_at)))
        for i, n in enumerate(stats.accepted_per_position):
            self.accepted_at[i] += n

    def tokens_in(self, start: float, end: float) -> int:
        return sum(n for t, n in self.commits if start <= t < end)


def _generator(mode: str, draft: EmulatedDraft, client, params: SamplingParams, seed: int | None = None):
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.speculator import Speculator
    from local_draft.stream_speculator import StreamSpeculator

    if mode == "server":
        return ServerOnlyGenerator(client, draft.end_ids)
    if mode in ("default", "chain") or mode in PINNED_TREE_MODES:
        # the emulated service stands for a GPU elsewhere, behind the proxy's round trip (its
        # loopback address would otherwise count it as sharing this machine's cores)
        return StreamSpeculator(draft, client, params, seed=seed, colocated=False, trees=mode != "chain",
                                tree_width=PINNED_TREE_MODES.get(mode))
    if mode == "rounds":
        return Speculator(draft, client, params, k=None, pipeline=True, seed=seed)
    if mode == "k0":
        return Speculator(draft, client, params, k=0, seed=seed)
    raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")


def run_user(index: int, mode: str, url: str, draft: EmulatedDraft, entries: list, max_tokens: int,
          start: threading.Barrier, window: list[float], record: UserRecord, stagger_s: float = 0.0,
          pace_s: float = 0.0, think_s: float = 0.0) -> None:
    from local_draft.verify_client import VerifyClient

    # a user's waits between replies: its own seeded draws, so the k-th wait is the same in every mode
    waits = random.Random(index)
    # a sampled recording's text is its seed's: every user asks with the recording's sampling and seed
    params, seed = draft.recording.params, draft.recording.seed
    client = None
    try:
        client = VerifyClient(url, draft.hello(params, seed=seed, client=f"benchmarks.capacity ({mode})"),
                              stall_timeout_s=120.0)
        generator = _generator(mode, draft, client, params, seed)
        start.wait()
        time.sleep(stagger_s)  # users arrive spread over the warm-up, not in one herd that stays in step
        reply = 0
        while time.perf_counter() < window[1]:
            entry = entries[(index + reply) % len(entries)]
            reply += 1
            began = time.perf_counter()
            result = generator.generate(entry.prompt, max_tokens,
                                        lambda tokens, _: record.commits.append((time.perf_counter(), len(tokens))))
            stats = result.stats
            record.replies.append((reply - 1, time.perf_counter() - began, len(result.token_ids)))
            if window[0] <= began < window[1]:  # not the first wave, every user's prompt at once
                record.first_token_s.append(stats.first_token_s or stats.wall_s)
                record.first_token_replies.append(reply - 1)
            record.passes += stats.verified_rounds
            record.tokens += len(result.token_ids)
            record.drafted += stats.drafted
            record.accepted += stats.accepted
            record.add_depths(stats)
            record.width = getattr(getattr(generator, "controller", None), "width", 1)
            expected = entry.path[:max_tokens]
            if result.token_ids != expected:
                at = next((i for i, (a, b) in enumerate(zip(result.token_ids, expected)) if a != b),
                          min(len(result.token_ids), len(expected)))
                record.differing.append(f"user {index}, {entry.text[:30]!r}: differs at token {at}")
            if pace_s:  # the next reply is due pace_s after this one began, whenever this one ended
                time.sleep(max(0.0, min(began + pace_s, window[1]) - time.perf_counter()))
            elif think_s:  # a person reads the reply, then asks again
                time.sleep(max(0.0, min(waits.expovariate(1.0 / think_s), window[1] - time.perf_counter())))
    except threading.BrokenBarrierError:
        record.error = f"user {index}: another user failed before the start"
    except Exception as exc:  # reported, never raised from a thread
        record.error = f"user {index}: {type(exc).__name__}: {exc}"
        start.abort()
    finally:
        if client is not None:
            client.close()


class WatchCuts(logging.Handler):
    """Counts, while in its `with`, the links the clients' ping watch cut as stalled (its warnings)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1

    def __enter__(self) -> "WatchCuts":
        logging.getLogger("local_draft.ping_watch").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("local_draft.ping_watch").removeHandler(self)
