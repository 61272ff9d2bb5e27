"""The emulated drafter: a draft model whose work takes the time a device profile gives it.

It is used wherever the client's `DraftModel` is (the stream loop, the round-based loop,
offline tokens): it reads texts and guesses tokens with the same methods, and keeps a
cache of what it has read, so that what a call costs is what the real drafter's would
(reading n new tokens: the profile's prefill time for n, or a decode step for one; each
guess after the first a decode step). The time is spent sleeping, so sixty-four emulated
drafters fit beside a service on two cores. Its guesses come from
- the recording (runs on the default pair, greedy or sampled under the recording's seed): the
  real drafter's guess (its argmax, or its race's winner) at every position of the target's
  path (benchmarks/emulation/recording.py), and where recorded its top
  few guesses with their probabilities, which a tree's branches take (a level of b branches
  costs the profile's `level_ms(b)`, the first after a frame b plus the committed tokens it
  decodes in the same batch, as the real drafter re-roots its branches: `_reroot`); or
- a real draft model (the tiny one, for other sampled runs), whose own compute counts towards
  the profile's time.
The vocabulary (tokenizing, the handshake's fingerprint, end tokens) is always the real draft
GGUF's, loaded vocabulary-only for the replay.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from benchmarks.emulation.profiles import DrafterProfile
from benchmarks.emulation.recording import Recording
from benchmarks.emulation.target import ReplayError
from local_draft.draft_model import (BATCH_COST_WIDTHS, CATCH_UP_PIECE, MAX_FRESH_TOKENS, DraftModel, DraftModelError,
                                     committed_reach)
from wire.protocol import Hello, SamplingParams, SparseDist


class EmulatedDraft:
    def __init__(self, model: DraftModel, profile: DrafterProfile, recording: Recording | None = None,
                 time_scale: float = 1.0, n_ctx: int = 4096):
        """`recording` None: `model` (a real draft model, this drafter's own) guesses; else the
        recording does, and `model` gives only the vocabulary (one vocabulary-only model may
        serve many emulated drafters)."""
        self.model = model
        self.recording = recording
        self.profile = profile
        self.time_scale = time_scale
        self.path = self.model.path
        self.n_ctx = n_ctx
        self.vocab_size, self.bos_id, self.eos_id = self.model.vocab_size, self.model.bos_id, self.model.eos_id
        self.add_bos = self.model.add_bos
        self.gpu_offload = True  # what it stands for
        self.last_catch_up = 0
        self.piece_s = profile.read_ms(CATCH_UP_PIECE) / 1000 * time_scale
        self._cached: list[int] = []  # what the emulated drafter has read
        # a tree's branches: the text they grew from (None: none since the last read) and the paths decoded
        self._branch_base: list[int] | None = None
        self._branch_paths: set[tuple[int, ...]] = set()

    # ---- the vocabulary: the real GGUF's ------------------------------------------------

    @property
    def vocab_fingerprint(self) -> str:
        return self.model.vocab_fingerprint

    @property
    def end_ids(self) -> frozenset[int]:
        return self.model.end_ids

    @property
    def chat_template(self) -> str | None:
        return self.model.chat_template

    def hello(self, params: SamplingParams, seed: int | None = None, client: str = "") -> Hello:
        return self.model.hello(params, seed=seed, client=client)

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.model.tokenize(text, add_bos)

    def token_bytes(self, token_id: int) -> bytes:
        return self.model.token_bytes(token_id)

    def token_text(self, token_id: int) -> bytes:
        return self.model.token_text(token_id)

    # ---- reading ------------------------------------------------------------------------

    @property
    def evaluated(self) -> list[int]:
        return list(self._cached)

    def lag(self, context: Sequence[int]) -> int:
        common = 0
        limit = min(len(self._cached), len(context))
        while common < limit and self._cached[common] == context[common]:
            common += 1
        return len(context) - min(common, len(context) - 1)

    def rollback(self, n_keep: int) -> None:
        del self._cached[n_keep:]

    def keep_up(self, context: Sequence[int], should_stop: Callable[[], bool] | None = None) -> None:
        self._check_room(context, 0)
        self._catch_up(context, should_stop)

    def _catch_up(self, context: Sequence[int], should_stop: Callable[[], bool] | None = None) -> bool:
        """Read what of `context` is not cached (at least its last token), in pieces when it may stop."""
        if not context:
            raise DraftModelError("empty context: drafting needs at least one token (the prompt or BOS)")
        common = len(context) - self.lag(context)
        self.rollback(common)
        pending = list(context[common:])
        self.last_catch_up = len(pending)
        step = len(pending) if should_stop is None else CATCH_UP_PIECE
        for start in range(0, len(pending), step):
            if should_stop is not None and should_stop():
                return False
            piece = pending[start:start + step]
            self._spend(self.profile.read_ms(len(piece)))
            self._cached += piece
        return True

    # ---- guessing -----------------------------------------------------------------------

    def guess(self, context: Sequence[int], params: SamplingParams, clocks: np.ndarray | None,
              allowed: np.ndarray | None = None) -> int:
        self._check_room(context, 1)
        began = time.perf_counter()
        lag = self.lag(context)
        if allowed is not None and self.recording is not None:
            raise ReplayError("a recording holds the unconstrained path: a grammar needs a real draft model")
        if self.recording is None:
            token = self.model.guess(context, params, clocks, allowed)
            self._cached = list(context)
            self._top_up(began, self.profile.read_ms(lag))
            return token
        self._catch_up(context)
        return self._recorded_guess(context, params)

    def propose(self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator,
                cap: int | None = 64, should_stop: Callable[[], bool] | None = None,
                allowed: np.ndarray | None = None) -> tuple[list[int], list[SparseDist]]:
        self._check_room(context, k)
        if self.recording is None:
            began, lag = time.perf_counter(), self.lag(context)
            tokens, dists = self.model.propose(context, k, params, rng, cap, should_stop, allowed)
            self._cached = list(context) + tokens[:-1]
            self._top_up(began, self.profile.read_ms(lag) + self.profile.token_ms * max(len(tokens) - 1, 0))
            return tokens, dists
        self._catch_up(context)
        return self._draft(list(context), k, params, should_stop), []

    def draft_ahead(self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator,
                    should_stop: Callable[[], bool]) -> tuple[int | None, list[int], list[SparseDist]]:
        self._check_room(context, k + 1)
        if self.recording is None:
            began, lag = time.perf_counter(), self.lag(context)
            guess, tokens, dists = self.model.draft_ahead(context, k, params, rng, should_stop)
            self._cached = list(self.model.evaluated)
            self._top_up(began, self.profile.read_ms(lag) + self.profile.token_ms * len(tokens))
            return guess, tokens, dists
        if not self._catch_up(context, should_stop):
            return None, [], []
        guess = self._recorded_guess(context, params)
        if k == 0 or guess in self.end_ids or should_stop():
            return guess, [], []
        self._spend(self.profile.token_ms)  # evaluating the guess
        self._cached.append(guess)
        return guess, self._draft(list(context) + [guess], k, params, should_stop), []

    def _draft(self, context: list[int], k: int, params: SamplingParams,
               should_stop: Callable[[], bool] | None) -> list[int]:
        """k recorded guesses after the cached `context`, each after the first costing a decode step."""
        tokens: list[int] = []
        for i in range(k):
            if i and should_stop is not None and should_stop():
                break
            if i:
                self._spend(self.profile.token_ms)
                self._cached.append(tokens[-1])
            tokens.append(self._recorded_guess(context + tokens, params))
        return tokens

    def _recorded_guess(self, context: Sequence[int], params: SamplingParams) -> int:
        self._check_params(params)
        entry = self.recording.find(list(context))
        if entry is None:
            raise ReplayError("no recording starts like this context: the replay knows the default prompt set only")
        at = len(context) - len(entry.prompt)
        # After a wrong guess (the context off the recorded path) the real drafter's guess was not
        # recorded: the recorded one stands in, and nobody verifies it (the chain is already wrong).
        return entry.guesses[at] if at < len(entry.guesses) else self.eos_id

    def _check_params(self, params: SamplingParams) -> None:
        problem = self.recording.params_problem(params)
        if problem:
            raise ReplayError(problem)

    # ---- trees --------------------------------------------------------------------------

    def batch_cost(self, context: Sequence[int]) -> dict[int, float]:
        """The profile's cost of decoding b branches together over one (the real drafter measures it)."""
        return {b: self.profile.batch_cost(b) for b in BATCH_COST_WIDTHS}

    def branch_guesses(self, context: Sequence[int], paths: Sequence[Sequence[int]], params: SamplingParams,
                       clocks_for: Callable[[int], np.ndarray | None]) -> list[list[tuple[int, float]]]:
        """As DraftModel.branch_guesses: each branch's candidates, best first, with probabilities; a
        level costs the profile's step of that many sequences. The replay's candidates are the
        recorded top guesses at each position of the target's path (only the argmax, sure, where none
        were recorded); off the path nothing is verified, and the path's candidates at that position
        stand in."""
        longest = max((len(path) for path in paths), default=0)
        self._check_room(context, longest + 1)
        grown = sum(1 for path in paths if path)
        if self.recording is None:
            began = time.perf_counter()
            fresh, lag = self._reroot(context), self.lag(context)
            out = self.model.branch_guesses(context, paths, params, clocks_for)
            self._cached, self._branch_base = list(context), list(context)
            self._branch_paths = {tuple(path) for path in paths}
            self._top_up(began, self._level_ms(grown, fresh, lag))
            return out
        self._check_params(params)
        fresh = self._reroot(context)
        if fresh is None and self._cached != list(context):  # a text the branches did not continue: read it
            self._catch_up(context)
        self._spend(self._level_ms(grown, fresh, 0))
        self._branch_base, self._branch_paths = list(context), {tuple(path) for path in paths}
        entry = self.recording.find(list(context))
        if entry is None:
            raise ReplayError("no recording starts like this context: the replay knows the default prompt set only")
        out = []
        for path in paths:
            at = len(context) + len(path) - len(entry.prompt)
            if at >= len(entry.guesses):
                out.append([(self.eos_id, 1.0)])
            elif entry.top:
                # On the path: the drafter's own candidates there. Off it (below a guess the target
                # did not take) nothing is ever verified, but the tree's shape still depends on how
                # sure the drafter is: the candidates at that position on the path stand in, so an
                # off-path branch is as sure as the drafter was there (a certain one, 1.0, would
                # outlive every real branch in the beam and take its place).
                out.append([(int(token), float(p)) for token, p in entry.top[at]])
            else:
                out.append([(entry.guesses[at], 1.0)])
        return out

    def _reroot(self, context: Sequence[int]) -> int | None:
        """The committed tokens a level below `context` decodes in its own batch, as the real drafter
        re-roots its branches there (local_draft/draft_model.py `_reroot`): those after the longest
        committed prefix (but the newest) a branch decoded; None where `context` does not continue the
        text the branches grew from (it is read first, as a catch-up), 0 where it is that text."""
        base = self._cached
        if self._branch_base != base or len(context) < len(base) or list(context[:len(base)]) != base:
            self._branch_base, self._branch_paths = None, set()
            return None
        committed = tuple(context[len(base):])
        if not committed:
            return 0
        reach = max((committed_reach(path, committed) for path in self._branch_paths), default=0)
        if len(committed) - reach > MAX_FRESH_TOKENS:
            self._branch_base, self._branch_paths = None, set()
            return None
        self._cached = list(context)
        return len(committed) - reach

    def _level_ms(self, grown: int, fresh: int | None, lag: int) -> float:
        """A level of `grown` branches with `fresh` committed tokens in its batch (None: after reading
        `lag` tokens apart, a catch-up's step or prefill)."""
        if fresh is None:
            return self.profile.read_ms(lag) + (self.profile.level_ms(grown) if grown else 0.0)
        return self.profile.level_ms(grown + fresh) if grown + fresh else 0.0

    # ---- time ---------------------------------------------------------------------------

    def _spend(self, ms: float) -> None:
        time.sleep(ms / 1000 * self.time_scale)

    def _top_up(self, began: float, ms: float) -> None:
        left = ms / 1000 * self.time_scale - (time.perf_counter() - began)
        if left > 0:
            time.sleep(left)

    def _check_room(self, context: Sequence[int], k: int) -> None:
        if len(context) + k > self.n_ctx:
            raise DraftModelError(
                f"context full: {len(context)} tokens + {k} drafted exceeds the draft context of {self.n_ctx}")
