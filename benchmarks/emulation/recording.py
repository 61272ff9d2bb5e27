"""The default pair's decisions, recorded once from the real models, for the emulator to replay.

For each prompt of the default prompt set (app/bench/prompts.py): its token ids, the target's
greedy continuation (`path`: what `--mode server` streams, recorded through a real service),
and the drafter's greedy guess at each position along it (`guesses[i]`: the draft model's
argmax after prompt + path[:i], evaluated token by token as a drafter does). That is every
decision speculation needs under greedy decoding: a block or chain of guesses is right up to
its first wrong token, and every guess up to there continues the target's own path, so
acceptance position by position is the real pair's. With the drafter's top few guesses and their
probabilities at each position (`top`), a tree's acceptance is the real pair's too: a tree
branches where the drafter was unsure, and its second choice is right where the target took it.
What a drafter would guess after a wrong
guess is not recorded (no verification ever looks at it); the replay repeats the recorded
guess there, and the stream drops it.

A recording may be sampled instead (`about["sampling"]`: temperature, top-k, top-p and the seed).
Sampled, every decision is the race over the clocks of the seed at each absolute position
(wire/randomness.py), on both ends: the path is what the target streams under that seed, a
guess the drafter's race winner there, and `top` the drafter's candidates in the race's order
(what a tree's branches take). So the text is a function of the seed, and a replay whose users
ask with the recording's parameters and seed decides every guess as the real pair would.

`benchmarks/emulation/record.py` makes the file; the emulated target and drafter read it
(benchmarks/emulation/target.py, drafter.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wire.protocol import SamplingParams

RECORDINGS_DIR = Path(__file__).parent / "recordings"
DEFAULT_RECORDING = RECORDINGS_DIR / "default-pair.json"
SAMPLED_RECORDING = RECORDINGS_DIR / "default-pair-t0.7.json"  # T 0.7, seed 1


@dataclass
class Recorded:
    kind: str  # the prompt's kind: code, chat, prose, repeat
    text: str
    prompt: list[int]
    path: list[int]  # the target's continuation (greedy, or under the recording's seed)
    guesses: list[int]  # guesses[i]: the drafter's guess after prompt + path[:i] (its argmax, or race winner)
    stop: str  # "eos": path ends with an end token; "max_tokens": recorded that far
    # top[i]: the drafter's likeliest few tokens after prompt + path[:i], [token, probability] best
    # first (top[i][0][0] is guesses[i]); empty where not recorded (a tree then cannot branch)
    top: list = field(default_factory=list)


@dataclass
class Recording:
    entries: list[Recorded]
    about: dict = field(default_factory=dict)  # models, date, machine, command

    def __post_init__(self) -> None:
        self._by_length: dict[int, dict[tuple[int, ...], Recorded]] = {}
        for entry in self.entries:
            self._by_length.setdefault(len(entry.prompt), {})[tuple(entry.prompt)] = entry

    def find(self, tokens: list[int]) -> Recorded | None:
        """The entry whose prompt `tokens` start with (the longest, if several)."""
        for length in sorted(self._by_length, reverse=True):
            if length <= len(tokens):
                entry = self._by_length[length].get(tuple(tokens[:length]))
                if entry is not None:
                    return entry
        return None

    def begins_a_prompt(self, tokens: list[int]) -> bool:
        """Whether `tokens` are the start of some entry's prompt, short of its end (a prompt the
        service reads in pieces: a shared pass gives a long prompt a piece at a time)."""
        return any(len(entry.prompt) > len(tokens) and entry.prompt[:len(tokens)] == tokens
                   for entry in self.entries)

    @property
    def params(self) -> SamplingParams:
        """The sampling the recording was made with (greedy where it says none)."""
        sampling = self.about.get("sampling") or {}
        return SamplingParams(float(sampling.get("temperature", 0.0)), int(sampling.get("top_k", 0)),
                              float(sampling.get("top_p", 1.0)))

    @property
    def seed(self) -> int | None:
        """The seed of a sampled recording (its users must ask with it), None for a greedy one."""
        return (self.about.get("sampling") or {}).get("seed")

    @property
    def sampling_said(self) -> str:
        """How the recording samples, in words: "greedy", or its temperature, top-k, top-p and seed."""
        params = self.params
        if params.greedy:
            return "greedy"
        return f"T {params.temperature:g}, top-k {params.top_k}, top-p {params.top_p:g}, seed {self.seed}"

    def params_problem(self, params: SamplingParams) -> str:
        """Why decisions recorded here cannot be replayed for `params` ("" where they can): a greedy
        recording holds no race's winners, a sampled one no argmax, nor another temperature's."""
        if params == self.params:
            return ""
        said = "greedy" if self.params.greedy else f"sampled ({self.sampling_said})"
        return (f"the recording is {said}, asked with {params}: replay it with its own sampling, or record one for "
                "these parameters (python -m benchmarks.emulation.record --temperature T --seed S)")

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"about": self.about, "entries": [asdict(e) for e in self.entries]}) + "\n")

    @classmethod
    def load(cls, path: Path = DEFAULT_RECORDING) -> Recording:
        if not path.is_file():
            raise FileNotFoundError(f"no recording at {path}: make one with `python -m benchmarks.emulation.record`")
        data = json.loads(path.read_text())
        return cls([Recorded(**entry) for entry in data["entries"]], data.get("about", {}))


def on_path(entry: Recorded, tokens: list[int]) -> int:
    """How many tokens after the prompt in `tokens` follow the recorded path (its length if all do)."""
    after = tokens[len(entry.prompt):]
    n = 0
    for mine, recorded in zip(after, entry.path):
        if mine != recorded:
            break
        n += 1
    return n


def thinned(recording: Recording, acceptance: float, seed: int = 0) -> Recording:
    """The recording with the drafter's guesses made worse: each guess that is right (the target's
    path token) is swapped, at random (seeded), for its second choice (or another token where none
    was recorded), so that a first guess is right `acceptance` of the time over the whole recording,
    as it is for a small drafter against a much larger target. The target's paths are untouched:
    only the drafters read the guesses. A recording already at or below `acceptance` is returned as it is."""
    import random

    right = sum(g == p for e in recording.entries for g, p in zip(e.guesses, e.path))
    total = sum(min(len(e.guesses), len(e.path)) for e in recording.entries)
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"the acceptance to thin to must be between 0 and 1, got {acceptance}")
    if not total or right / total <= acceptance:
        return recording
    swap = 1.0 - acceptance * total / right  # of the right guesses
    rng = random.Random(seed)
    entries = []
    for entry in recording.entries:
        guesses, top = list(entry.guesses), [list(map(list, each)) for each in entry.top]
        for i, (guess, token) in enumerate(zip(entry.guesses, entry.path)):
            if guess != token or rng.random() >= swap:
                continue
            others = [each for each in (top[i] if i < len(top) else []) if each[0] != token]
            if others:  # the drafter's second choice goes first; the right token stays among the rest
                top[i] = [others[0]] + [each for each in top[i] if each is not others[0]]
                guesses[i] = others[0][0]
            else:
                guesses[i] = token + 1 if token > 0 else 1
        entries.append(Recorded(entry.kind, entry.text, entry.prompt, entry.path, guesses, entry.stop, top))
    about = dict(recording.about, thinned_to=acceptance, thinned_seed=seed)
    return Recording(entries, about)


def first_guess_acceptance(recording: Recording) -> float:
    """How often the drafter's first guess is the target's token, over every recorded position."""
    pairs = [(g, p) for e in recording.entries for g, p in zip(e.guesses, e.path)]
    return sum(g == p for g, p in pairs) / max(len(pairs), 1)
