"""The emulated target: the service's real machinery, with forward passes timed by a device profile.

`EmulatedTarget` is a target backend (remote_verify/backends: new_cache, forward, truncate,
forward_many) that the real `VerifyService` runs: sessions, scheduler, shared passes,
acceptance and protocol are the product's own. Only the forward pass is stood in for: its
tokens come from an inner backend, and the pass is then held, by sleeping (no CPU spent),
until it has taken what the profile says a pass of that shape takes:
c(tokens in the pass, sessions in it, their cached tokens) (benchmarks/emulation/profiles.py),
times `time_scale`. The inner backend is
- `ReplayTarget` for runs on the default pair: the target's path for each prompt, recorded
  once from the real model (benchmarks/emulation/recording.py), returned position by position
  as argmax ids (greedy), or as logits certain of the path's token (a sampled recording: the
  race over any clocks then picks it, as the real target's did under the recording's seed), so
  every verification decides as the real target did;
- a real tiny-model backend (llama.cpp) for other sampled runs and tests, whose own compute time
  counts towards the profile's.

A tree of guesses (remote_verify/backends/target.py `Pass.tree`) is passed to the inner backend
when it has tree attention, and costed as any pass, by the tokens it feeds: its nodes.

A pass whose inner work outlasts the profile is not shortened: `overrun_s` adds up the
time by which passes ran over, so a run can say how far its machine kept up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from benchmarks.emulation.profiles import TargetProfile
from benchmarks.emulation.recording import Recorded, Recording
from remote_verify.backends.target import Pass, run_passes


class ReplayError(RuntimeError):
    """The replay was asked what it did not record (another prompt, more tokens, sampling)."""


@dataclass
class ReplayCache:
    tokens: list[int] = field(default_factory=list)
    entry: Recorded | None = None  # the recorded prompt these tokens start with
    on_path: int = 0  # tokens after the prompt that follow the recorded path


# A replayed row's logit at the recorded token (0 elsewhere): at any temperature the warped
# distribution puts all its mass there (exp(-SURE / T) underflows), so the race picks it whatever
# its clocks, as the real target's race picked it under the recording's seed.
SURE = 1e4


class ReplayTarget:
    """The default pair's target, replayed: its choice at every position of the recorded paths.

    A tree of guesses is replayed too: a node whose ancestors follow the recorded path scores the
    path's next token, as the real target would after that text; the others are never decisive."""

    batch_invariant = True
    tree_attention = True

    def __init__(self, recording: Recording, vocab_gguf: Path, max_context: int = 4096):
        from local_draft.draft_model import DraftModel

        self.recording = recording
        self._vocab = DraftModel(vocab_gguf, vocab_only=True)
        self.vocab_size = self._vocab.vocab_size
        self.bos_id, self.eos_id = self._vocab.bos_id, self._vocab.eos_id
        self.max_context = max_context
        self.name = "replay"

    def token_texts(self) -> list[bytes]:
        return [self._vocab.token_text(i) for i in range(self.vocab_size)]

    def new_cache(self) -> ReplayCache:
        return ReplayCache()

    def truncate(self, cache: ReplayCache, length: int) -> None:
        del cache.tokens[length:]
        if cache.entry is not None:
            if length < len(cache.entry.prompt):
                cache.entry, cache.on_path = None, 0
            else:
                cache.on_path = min(cache.on_path, length - len(cache.entry.prompt))

    def forward(self, cache: ReplayCache, tokens: Sequence[int], n_logits: int,
                tree: Sequence[int] | None = None) -> np.ndarray:
        """Logits (n_logits, V) certain of the recorded token, for callers that want logits (the
        service's cost calibration, which runs a made-up history: that scores end-of-text)."""
        if tree is not None:
            ids = self._append_tree(cache, tokens, n_logits, tree)
        else:
            ids = self._append(cache, tokens, n_logits, strict=False)
        return self._sure(ids)

    def forward_many(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        """Each pass's argmax ids, or (a sampled session's) logits certain of them."""
        results = []
        for item in passes:
            if item.tree is not None:
                ids = self._append_tree(item.cache, item.tokens, item.n_logits, item.tree)
            else:
                ids = self._append(item.cache, item.tokens, item.n_logits)
            results.append(ids if item.argmax_only else self._sure(ids))
        return results

    def _sure(self, ids: np.ndarray) -> np.ndarray:
        logits = np.zeros((len(ids), self.vocab_size), dtype=np.float32)
        logits[np.arange(len(ids)), ids] = SURE
        return logits

    def _append_tree(self, cache: ReplayCache, tokens: Sequence[int], n_logits: int,
                     parents: Sequence[int]) -> np.ndarray:
        """The ids of a pass whose last tokens are a tree: the rows before it as `_append` gives them,
        then each node's, read at the path index after its depth (the tree's nodes are cached in
        node order; `keep_path` keeps the kept ones)."""
        head = len(tokens) - len(parents)
        before = self._append(cache, tokens[:head], n_logits - len(parents))
        entry, prompt = cache.entry, len(cache.entry.prompt)
        after = len(cache.tokens) - prompt  # path index of the tree's first guesses
        on_path = cache.on_path == after
        follows: list[bool] = []  # node i's text so far is the recorded path
        depths: list[int] = []
        ids = np.empty(len(parents), dtype=np.int64)
        for i, (token, parent) in enumerate(zip(tokens[head:], parents)):
            depths.append(1 if parent < 0 else depths[parent] + 1)
            index = after + depths[i] - 1  # the path index this node guessed
            follows.append((on_path if parent < 0 else follows[parent]) and index < len(entry.path)
                           and entry.path[index] == token)
            predicted = index + 1
            if predicted < len(entry.path):
                ids[i] = entry.path[predicted]  # off the path it is never decisive
            elif follows[i] and entry.stop == "max_tokens":
                raise ReplayError(f"the recording holds {len(entry.path)} tokens after this prompt: record more "
                                  "(python -m benchmarks.emulation.record --tokens N)")
            else:
                ids[i] = self.eos_id
        cache.tokens += list(tokens[head:])
        return np.concatenate([before, ids])

    def keep_path(self, cache: ReplayCache, length: int, nodes: Sequence[int]) -> None:
        tree = cache.tokens[length:]
        self.truncate(cache, length)
        cache.tokens += [tree[node] for node in nodes]
        if cache.entry is not None:
            self._follow(cache)

    @staticmethod
    def _follow(cache: ReplayCache) -> None:
        """Count the cached tokens after the prompt that follow the recorded path."""
        entry = cache.entry
        after = cache.tokens[len(entry.prompt):]
        while cache.on_path < min(len(after), len(entry.path)) and after[cache.on_path] == entry.path[cache.on_path]:
            cache.on_path += 1

    def _append(self, cache: ReplayCache, tokens: Sequence[int], n_logits: int, strict: bool = True) -> np.ndarray:
        cache.tokens += list(tokens)
        if cache.entry is None:
            cache.entry = self.recording.find(cache.tokens)
            if cache.entry is None and (not strict or self.recording.begins_a_prompt(cache.tokens)):
                # a prompt's first pieces: no token is taken from their rows (the last piece's is),
                # and the entry is found once the whole prompt is in
                return np.full(n_logits, self.eos_id, dtype=np.int64)
            if cache.entry is None:
                raise ReplayError(f"no recording starts like this history ({len(cache.tokens)} tokens): the replay "
                                  "knows the default prompt set only")
        entry, prompt = cache.entry, len(cache.entry.prompt)
        self._follow(cache)
        ids = np.empty(n_logits, dtype=np.int64)
        for row in range(n_logits):
            predicted = len(cache.tokens) - n_logits + row + 1 - prompt  # the path index this row predicts
            if predicted < 0:
                ids[row] = cache.tokens[prompt + predicted]  # inside the prompt: nobody reads it
            elif predicted < len(entry.path):
                ids[row] = entry.path[predicted]  # off the path (after a wrong guess) it is never decisive
            elif predicted <= cache.on_path and entry.stop == "max_tokens":
                raise ReplayError(f"the recording holds {len(entry.path)} tokens after this prompt: record more "
                                  "(python -m benchmarks.emulation.record --tokens N)")
            else:
                ids[row] = self.eos_id  # past an end token, or off the path
        return ids


@dataclass
class EmulatedCache:
    inner: Any
    length: int = 0  # cached tokens, for the profile's context term


class EmulatedTarget:
    """An inner target backend whose passes take the time a device profile gives them."""

    def __init__(self, inner, profile: TargetProfile, time_scale: float = 1.0):
        self.inner = inner
        self.profile = profile
        self.time_scale = time_scale
        self.name = f"emulated:{profile.name}"
        self.batch_invariant = inner.batch_invariant
        self.tree_attention = getattr(inner, "tree_attention", False)
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context
        self.bos_id, self.eos_id = inner.bos_id, inner.eos_id
        self.passes = 0
        self.overrun_s = 0.0  # time by which inner work outlasted the profile

    def token_texts(self) -> list[bytes]:
        return self.inner.token_texts()

    def new_cache(self) -> EmulatedCache:
        return EmulatedCache(self.inner.new_cache())

    def truncate(self, cache: EmulatedCache, length: int) -> None:
        self.inner.truncate(cache.inner, length)
        cache.length = min(cache.length, length)

    def release(self, cache: EmulatedCache) -> None:
        release = getattr(self.inner, "release", None)
        if release is not None:
            release(cache.inner)

    def keep_path(self, cache: EmulatedCache, length: int, nodes: Sequence[int]) -> None:
        self.inner.keep_path(cache.inner, length, nodes)
        cache.length = min(cache.length, length + len(nodes))

    def forward(self, cache: EmulatedCache, tokens: Sequence[int], n_logits: int,
                tree: Sequence[int] | None = None) -> np.ndarray:
        started = time.perf_counter()
        context = cache.length
        if tree is not None:
            logits = self.inner.forward(cache.inner, tokens, n_logits, tree=tree)
        else:
            logits = self.inner.forward(cache.inner, tokens, n_logits)
        cache.length += len(tokens)
        self._hold(started, len(tokens), 1, context, context)
        return logits

    def forward_many(self, passes: Sequence[Pass]) -> list[np.ndarray]:
        started = time.perf_counter()
        context = sum(item.cache.length for item in passes)
        longest = max((item.cache.length for item in passes), default=0)
        results = run_passes(self.inner, [Pass(item.cache.inner, item.tokens, item.n_logits, item.argmax_only,
                                               item.tree) for item in passes])
        for item in passes:
            item.cache.length += len(item.tokens)
        self._hold(started, sum(len(item.tokens) for item in passes), len(passes), context, longest)
        return results

    def _hold(self, started: float, tokens: int, sessions: int, context: int, longest: int) -> None:
        """Sleep until the pass has taken the profile's time for its shape."""
        self.passes += 1
        due = self.profile.pass_ms(tokens, sessions, context, longest) / 1000 * self.time_scale
        left = due - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
        else:
            self.overrun_s -= left
