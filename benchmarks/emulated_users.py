"""What a wave's emulated users are made of: the drafter profile, the recording, the vocabulary.

A `UserSetup` names them (it pickles, so a worker process of benchmarks/client_processes.py builds its
own users from it); `Users` is what it loads: one vocabulary-only draft model for every user, the
recording's prompts, and a fresh emulated drafter for each user.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.emulation.drafter import EmulatedDraft
from benchmarks.emulation.profiles import load_drafter_profile
from benchmarks.emulation.recording import Recording, thinned


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
