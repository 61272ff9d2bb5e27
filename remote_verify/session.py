"""One client's verification session, sans I/O: committed tokens and one KV position.

Invariant between rounds: the cache holds every committed token but the last, which
(being the target's own correction or bonus) has not been run through the model yet.
A round feeds that token, any appended tokens and the draft block in one forward pass,
decides acceptance, commits, and truncates the cache back to the invariant: a rejected
draft costs a truncation, never a recompute of the prefix.

A round is device work in two halves (`verify_work`): planned (checked, its feed built,
nothing changed) before a forward pass that other sessions' rounds may share, and finished
(acceptance, commit, truncation) after it, with this session's share of the results.

A stream (Generate) is a pass after pass of the same kind (`stream_work`): each feeds the
last token and the client's pending guesses the pass chose to verify (remote_verify/
stream_drafts.py), keeps the guesses that equal the target's own pick and commits the
target's token after them. The target's pick at position n is its argmax (greedy) or the
race of its warped distribution over the session's clocks for n (wire/sampling.py), the same
whether a guess was there or not: a stream's text is a function of the seed alone. A Generate
with a grammar masks the target's logits first (wire/grammar.py): the pick is then the
constrained target's, and a guess is kept only where it equals that.

A long feed (a prompt, the history after a Sync) is prefilled in pieces when the device queue
asks (`Shareable.split`, remote_verify/scheduler.py): the request is checked and its appended
tokens taken into the history first, then each piece extends the cache, in a turn of its own,
and the round itself comes last, as if the history had been sent before it.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Sequence
from dataclasses import dataclass, field
from functools import partial

import msgspec
import numpy as np

from remote_verify.acceptance import accept_greedy, accept_sampled
from remote_verify.backends.target import CacheFull, Pass, TargetBackend
from remote_verify.memory import give_back_free_memory
from remote_verify.pass_costs import PassCosts
from remote_verify.scheduler import Planned, Shareable
from remote_verify.stream_drafts import PassSoFar, StreamDrafts, best_block, tree_chances
from wire import grammar as grammars
from wire.draft_tree import GuessTree, walk
from wire.limits import MAX_STOP_IDS, MAX_TOP_LOGPROBS
from wire.protocol import Generate, Grammar, SamplingParams, SparseDist, Sync, Synced, TokenLogprobs, Verdict, Verify
from wire.randomness import DecisionRandomness, seed_problem
from wire.sampling import race_choice, warp


def grammar_vocab(backend: TargetBackend) -> grammars.GrammarVocab:
    """The target's vocabulary as the grammar library reads it: built once per backend (1.5 s for
    151,936 tokens), when the service loads, so that no session's first grammar waits for it."""
    return grammars.vocab_for(f"{type(backend).__name__}:{id(backend)}", load=backend.token_texts,
                              n_vocab=backend.vocab_size)


@dataclass(frozen=True)
class SessionLimits:
    max_draft: int = 32  # longest block verified in one pass
    max_context: int = 4096  # committed tokens + draft, capped by the model's own limit


@dataclass
class StreamStep:
    """What one pass of a stream committed."""

    tokens: list[int]  # the guesses it kept, then the target's token (none after a kept stop token)
    accepted: int  # of tokens, the client's guesses
    drafted: int  # guesses the pass verified
    source: str  # who drafted them ("model", "ngram", "" for none)
    started: float  # when the pass was planned (time.perf_counter)
    forward_s: float
    pass_tokens: int  # tokens the whole pass ran, every member's
    pass_sessions: int
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when the stream asks


class SessionError(Exception):
    """A request the session refuses. Non-fatal errors leave the session as it was."""

    def __init__(self, code: str, message: str, fatal: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal


class Session:
    def __init__(self, backend: TargetBackend, sampling: SamplingParams, seed: int | None,
                 limits: SessionLimits, allocate: bool = True):
        """`allocate=False`: the KV cache is allocated by `ensure_cache` (on the device thread), at
        the latest by the first round: the service welcomes a client without waiting for a pool."""
        self.id = uuid.uuid4().hex[:12]
        self.backend = backend
        self.sampling = sampling
        self.limits = limits
        # Draws keyed by (seed, position): a rebuilt session repeats them, a later position never does.
        self.randomness = DecisionRandomness(seed)
        self.committed: list[int] = []
        self.cache = backend.new_cache() if allocate else None
        self._closed = False
        self.cached_len = 0  # positions in the cache
        self.last_seq = 0
        self._prefill_s = 0.0  # forward seconds of the prefill pieces before the round in progress
        self.grammar: grammars.TokenConstraint | None = None  # the running stream's, if its Generate has one
        self.logprobs = -1  # the running stream's: -1 none, else each token's and this many of the most likely

    def verify(self, request: Verify) -> Verdict:
        """Verify one block in a pass of its own."""
        return self.verify_work(request)()

    def verify_work(self, request: Verify) -> Shareable:
        """The round as device work that may share a forward pass with other sessions' rounds."""
        return Shareable(self.backend, partial(self._plan_verify, request),
                         lambda: len(self.committed) - self.cached_len + len(request.append) + len(request.draft),
                         split=partial(self._split_verify, request))

    def _split_verify(self, request: Verify, limit: int) -> tuple[Shareable, Shareable] | None:
        """Chunked prefill of a round: (a piece of at most `limit` history tokens, the round after it),
        or None when the history the cache lacks is that short. The request is checked first, and its
        appended tokens become history (the round that follows appends nothing)."""
        if len(self.committed) - self.cached_len + len(request.append) - 1 <= limit:
            return None
        if request.append:
            self._check_verify(request)
            if not self.sampling.greedy:
                self._checked_dists(request)
            self.committed += list(request.append)
            request = msgspec.structs.replace(request, committed_len=len(self.committed), append=[])
        return self._prefill_work(limit), self.verify_work(request)

    def _prefill_work(self, limit: int) -> Shareable:
        """Up to `limit` committed tokens the cache lacks (never the last one: the next round feeds it)."""
        def plan(so_far: PassSoFar | None = None) -> Planned:
            self.ensure_cache()
            feed = self.committed[self.cached_len:min(self.cached_len + limit, len(self.committed) - 1)]

            def finish(result: np.ndarray, forward_s: float) -> None:
                self.cached_len += len(feed)
                self._prefill_s += forward_s

            return Planned(Pass(self.cache, feed, 1, argmax_only=True), finish, self._undo)

        return Shareable(self.backend, plan, lambda: min(limit, len(self.committed) - 1 - self.cached_len),
                         starting=lambda: True)  # a prompt's piece: the reply's first token waits for it

    def ensure_cache(self) -> None:
        """Allocate the KV cache if it is not yet (SessionError sessions_full when there is no memory;
        closed once the session is: a stream's next pass may be queued behind its close, and planned
        on a freed cache it failed the whole shared pass it joined)."""
        if self._closed:
            raise SessionError("closed", "the session is closed", fatal=True)
        if self.cache is not None:
            return
        try:
            self.cache = self.backend.new_cache()
        except CacheFull as exc:
            raise SessionError("sessions_full", f"the service has no KV memory for this session now ({exc}): "
                               "reconnect in a few seconds, or use another replica", fatal=True) from exc

    def _plan_verify(self, request: Verify, so_far: PassSoFar | None = None) -> Planned:
        """Check the request and build its share of a pass; nothing changes until `finish`."""
        history = self._check_verify(request)
        self.ensure_cache()
        k = len(request.draft)
        draft_dists = None if self.sampling.greedy else self._checked_dists(request)
        feed = self.committed[self.cached_len:] + list(request.append) + list(request.draft)

        def finish(result: np.ndarray, forward_s: float) -> Verdict:
            started = time.perf_counter()
            if self.sampling.greedy:  # result: the (k+1,) argmax ids
                accepted, token = accept_greedy(result.tolist(), request.draft)
            else:  # result: the (k+1, V) logits
                # warped as acceptance reaches them: a block ends at its first rejection
                target_probs = _WarpedRows(result, self.sampling)  # (k+1, V)
                start = history  # the absolute position of draft[0]
                accepted, token = accept_sampled(target_probs, request.draft, draft_dists,
                                                 lambda i, what: self.randomness.at(start + i, what))
            self.committed += list(request.append) + list(request.draft[:accepted]) + [token]
            self.cached_len = len(self.committed) - 1
            self.backend.truncate(self.cache, self.cached_len)
            self.last_seq = request.seq
            forward_s, self._prefill_s = forward_s + self._prefill_s, 0.0  # the round's pieces count as its pass
            return Verdict(seq=request.seq, accepted=accepted, token=token,
                           committed_len=len(self.committed),
                           forward_s=forward_s, accept_s=time.perf_counter() - started)

        return Planned(Pass(self.cache, feed, k + 1, argmax_only=self.sampling.greedy), finish, self._undo)

    def _check_verify(self, request: Verify) -> int:
        """Refuse a round that cannot run (SessionError); the length of its history before the draft."""
        self._check_seq(request.seq)
        self._check_committed(request.committed_len)
        # lengths before ids: a request over a limit is refused without reading what it holds
        k = len(request.draft)
        if k > self.limits.max_draft:
            raise SessionError("draft_too_long", f"draft of {k} tokens exceeds the limit of {self.limits.max_draft}")
        history = len(self.committed) + len(request.append)
        if history == 0:
            raise SessionError("empty_context", "nothing to continue: append at least one prompt token (BOS)")
        if history + k + 1 > self.limits.max_context:
            raise SessionError(
                "context_full",
                f"{history} tokens + {k} drafted + 1 exceeds the context limit of {self.limits.max_context}")
        self.check_tokens(request.append, "append")
        self.check_tokens(request.draft, "draft")
        return history

    def _undo(self) -> None:
        """Drop what a failed pass may have left in the cache past the committed prefix."""
        self.backend.truncate(self.cache, self.cached_len)

    def start_generation(self, request: Generate) -> None:
        """Check a server-only request and take its appended tokens into the history."""
        self._check_seq(request.seq)
        self._check_committed(request.committed_len)
        keep = len(self.committed) if request.keep == -1 else request.keep
        if not 0 <= keep <= len(self.committed):
            raise SessionError("bad_request", f"keep must be -1 (all) or 0 to the {len(self.committed)} tokens "
                                              f"committed, got {request.keep}")
        if seed_problem(request.seed):
            raise SessionError("bad_seed", seed_problem(request.seed))
        if request.max_tokens < 1:
            raise SessionError("bad_request", f"max_tokens must be at least 1, got {request.max_tokens}")
        if not -1 <= request.logprobs <= MAX_TOP_LOGPROBS:
            raise SessionError("bad_request",
                               f"logprobs must be -1 (none) to {MAX_TOP_LOGPROBS}, got {request.logprobs}")
        if len(request.stop_ids) > MAX_STOP_IDS:
            raise SessionError("bad_request", f"{len(request.stop_ids)} stop_ids: send at most {MAX_STOP_IDS}")
        history = keep + len(request.append)
        if history == 0:
            raise SessionError("empty_context", "nothing to continue: append at least one prompt token (BOS)")
        if history + 1 > self.limits.max_context:
            raise SessionError("context_full", f"{history} tokens leave no room under the context limit "
                                               f"of {self.limits.max_context}")
        self.check_tokens(request.append, "append")
        self.check_tokens(request.stop_ids, "stop_ids")
        constraint = self._constraint(request.grammar, self.committed[:keep] + list(request.append),
                                      request.stop_ids)
        if keep < len(self.committed):
            self._keep_only(keep, history)
        self.committed += list(request.append)
        if request.seed is not None:
            self.randomness = DecisionRandomness(request.seed)
        self.last_seq = request.seq
        self.grammar = constraint
        self.logprobs = request.logprobs

    def _constraint(self, grammar: Grammar | None, history: list[int], stop_ids: list[int]):
        """The compiled grammar of a Generate, following what it constrained already (a resumed
        stream); SessionError bad_grammar when it cannot apply."""
        if grammar is None:
            return None
        if not grammars.available():
            raise SessionError("bad_grammar", "this service cannot apply grammars (llguidance is not installed)")
        if not stop_ids:
            raise SessionError("bad_grammar", "a grammar needs stop_ids: the tokens that may end its value")
        if grammar.start > len(history):
            raise SessionError("bad_grammar", f"the grammar starts at position {grammar.start}, after the "
                                              f"history's end ({len(history)})")
        try:
            constraint = grammars.TokenConstraint(grammar, grammar_vocab(self.backend), stop_ids)
        except grammars.GrammarError as exc:
            raise SessionError("bad_grammar", str(exc)) from exc
        if not constraint.follow(history[grammar.start:]):
            raise SessionError("bad_grammar", f"the tokens made since position {grammar.start} break the grammar")
        return constraint

    def generate_step(self) -> tuple[int, float, float]:
        """One token by the target alone, in a pass of its own; returns (token, when the step
        started, forward seconds)."""
        step = self.stream_work()()
        return step.tokens[0], step.started, step.forward_s

    def next_token_work(self) -> Shareable:
        """The next server-only token as device work that may share a pass with other sessions'."""
        return self.stream_work()

    def stream_work(self, drafts: StreamDrafts | None = None, stop_ids: frozenset[int] = frozenset(),
                    room: int = 1, costs: PassCosts | None = None) -> Shareable:
        """A stream's next pass as device work that may share a pass with other sessions': the
        target's next token, after the guesses of `drafts` that the pass chooses to verify.

        `room`: tokens the stream may still make (the block leaves one for the target's own);
        `costs`: the device's cost curve, which prices the guesses (none: every guess is taken)."""
        def tokens() -> int:  # what the pass must feed, for the queue's token budget: guesses fill what is left
            return len(self.committed) - self.cached_len

        work = Shareable(self.backend, partial(self._plan_stream_pass, drafts, stop_ids, room, costs), tokens,
                         starting=lambda: tokens() > 1)  # a new prompt (or a Sync's history) before its first token
        work.split = partial(self._split_stream, work)
        return work

    def _split_stream(self, work: Shareable, limit: int) -> tuple[Shareable, Shareable] | None:
        """Chunked prefill before a stream's pass: (a piece, the same pass after it), or None."""
        if len(self.committed) - self.cached_len - 1 <= limit:
            return None
        return self._prefill_work(limit), work

    def _guesses(self, drafts: StreamDrafts | None, stop_ids: frozenset[int], room: int) -> tuple[GuessTree, str]:
        """The pending guesses a pass may verify, as a tree (a chain's: a chain): within the limits,
        none after a stop token, and only the first-choice path where the backend has no tree attention."""
        if drafts is None:
            return GuessTree([], []), ""
        guesses, source = drafts.pending(self.committed, max(self.limits.max_draft, 0))
        if not getattr(self.backend, "tree_attention", False) and not guesses.is_chain:
            path = guesses.first_choice_path()
            guesses = GuessTree.chain(guesses.path_tokens(path))
        # depth: the stream's room and the context leave one token for the target's own
        depth = max(0, min(room - 1, self.limits.max_context - len(self.committed) - 1))
        return guesses.pruned(max(self.limits.max_draft, 0), depth, stop_ids), source

    def _plan_stream_pass(self, drafts: StreamDrafts | None, stop_ids: frozenset[int], room: int,
                          costs: PassCosts | None, so_far: PassSoFar | None = None) -> Planned:
        self.ensure_cache()
        started = time.perf_counter()
        so_far = so_far if so_far is not None else PassSoFar()
        position = len(self.committed)  # of the first guess, and of the target's token if there is none
        unrun = self.committed[self.cached_len:]
        guesses, source = self._guesses(drafts, stop_ids, room)
        room_left = min(len(guesses), so_far.budget - so_far.tokens - len(unrun), so_far.share + 0.999)
        guesses = guesses.pruned(max(0, int(room_left)), len(guesses))  # a prefix of a tree is a tree
        chances = None if guesses.is_chain or drafts is None else tree_chances(guesses, drafts.acceptance)
        take = len(guesses)
        if take and costs is not None:
            priced = so_far.costs if so_far.costs is not None else costs  # passes with as many members
            take = best_block(take, drafts.acceptance, priced.seconds, len(unrun), so_far, chances)
        block = guesses.pruned(take, take)
        if not block.tokens:
            expected = 1.0
        elif chances is None:
            expected = sum(drafts.acceptance ** i for i in range(len(block) + 1))
        else:
            expected = 1.0 + sum(chances[:len(block)])
        tree = None if block.is_chain else block.parents  # a chain runs as it always has: causal
        outcome: list[int] = []  # what the pass made, once finished

        def finish(result: np.ndarray, forward_s: float) -> StreamStep:
            # result: (b + 1,) argmax ids (greedy) or (b + 1, V) logits; row 0 scores `position`
            # (after the last committed token), row i + 1 the position after guess i, at its depth
            path, token = walk(block, lambda row, depth: self._target_pick(
                result, position, row, depth, block.tokens_to(row - 1)), stop_ids)
            kept = block.path_tokens(path)
            accepted = len(kept)
            # the stream ends at a kept stop token (the walk's last): nothing of the target's after it
            made = kept if token is None else kept + [token]
            if tree is not None:  # the pass cached every node: keep the history and the kept path, in order
                self.backend.keep_path(self.cache, position, path)
            # the i-th token made was scored by the row of the node before it (row 0: the history's)
            rows = [0] + [node + 1 for node in path]
            logprobs = [self._logprobs(result, rows[i], made[:i], each) for i, each in enumerate(made)] \
                if self.logprobs >= 0 else []
            self.committed += made
            self.cached_len = len(self.committed) - 1
            self.backend.truncate(self.cache, self.cached_len)
            if drafts is not None:
                if tree is None:
                    drafts.after_pass(position, block.tokens, accepted)
                else:
                    drafts.after_tree_pass(position, accepted, bool(block.children(path[-1] if path else -1)))
            forward_s, self._prefill_s = forward_s + self._prefill_s, 0.0  # its prefill pieces count as its pass
            outcome.append(len(made))  # the pass's ledger counts what it made (remote_verify/pass_ledger.py)
            return StreamStep(made, min(accepted, len(made)), len(block), source if block.tokens else "", started,
                              forward_s, so_far.tokens, so_far.sessions, logprobs)

        # a grammar masks logits, and log probabilities read them: a greedy pass then returns them, not its argmax
        argmax_only = self.sampling.greedy and self.grammar is None and self.logprobs < 0
        return Planned(Pass(self.cache, unrun + block.tokens, len(block) + 1, argmax_only=argmax_only, tree=tree),
                       finish, self._undo, expected, outcome)

    def _row_logits(self, result: np.ndarray, row: int, before: list[int]) -> np.ndarray:
        """The target's logits (V,) of the pass's row `row`, which continues the committed history by
        `before`, masked by the stream's grammar if it has one."""
        if self.grammar is None:
            return result[row]
        made = self.committed + list(before)  # the committed history ends at `position`
        if not self.grammar.follow(made[self.grammar.grammar.start:]):
            raise RuntimeError("the stream left its grammar")  # only masked picks are committed
        return self.grammar.mask(result[row])

    def _logprobs(self, result: np.ndarray, row: int, before: list[int], token: int) -> TokenLogprobs:
        """The target's log-softmax at the pass's row `row` (after the history and `before`): of
        `token`, and of the most likely tokens there."""
        logits = self._row_logits(result, row, before).astype(np.float64)
        logprobs = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))  # (V,)
        n = min(self.logprobs, logprobs.shape[0])
        top = np.argpartition(-logprobs, n - 1)[:n] if n else np.zeros(0, dtype=np.int64)  # not a sort of all V
        top = top[np.isfinite(logprobs[top])]  # a token the grammar refuses is not a candidate
        top = top[np.lexsort((top, -logprobs[top]))]  # most likely first; equal ones in ascending id
        return TokenLogprobs(float(logprobs[token]), top.tolist(), logprobs[top].tolist())

    def _target_pick(self, result: np.ndarray, position: int, row: int, depth: int,
                     before: Sequence[int] = ()) -> int:
        """The target's token at position + depth, from the pass's row `row` (a chain's rows are its
        depths; a tree's are its nodes), which continues the committed history by `before` (depth
        tokens): its argmax, or the race of its warped distribution over this session's clocks for
        that absolute position (never the depth alone: a tree's nodes at one depth share the clocks
        of their position, and so does a pass with no guesses); under a grammar, of its logits with
        every token the grammar refuses masked out, before anything else."""
        if self.sampling.greedy and result.ndim == 1:  # the pass returned its argmax ids
            return int(result[row])
        logits = self._row_logits(result, row, list(before))
        if self.sampling.greedy:
            return int(np.argmax(logits))
        probs = warp(logits, self.sampling)
        return race_choice(probs, self.randomness.race(position + depth, probs.shape[0]))

    def _keep_only(self, keep: int, history_len: int) -> None:
        """Drop the committed tokens from `keep` on, and their cache (at least one token of a
        history of `history_len` is left to feed, for the logits the next pass needs)."""
        self.cached_len = min(self.cached_len, keep, max(history_len - 1, 0))
        if self.cache is not None:
            self.backend.truncate(self.cache, self.cached_len)
        del self.committed[keep:]

    def sync(self, request: Sync) -> Synced:
        """Adopt the client's history (and its new seed, if it sends one); keep the cached prefix
        it shares with the old history."""
        if len(request.tokens) + 1 > self.limits.max_context:
            raise SessionError("context_full", f"history of {len(request.tokens)} tokens exceeds the context limit")
        if seed_problem(request.seed):
            raise SessionError("bad_seed", seed_problem(request.seed))
        self.check_tokens(request.tokens, "tokens")
        common = 0
        limit = min(self.cached_len, len(request.tokens))
        while common < limit and self.committed[common] == request.tokens[common]:
            common += 1
        self._keep_only(common, len(request.tokens))
        self.committed = list(request.tokens)
        self.last_seq = request.seq  # a Sync starts a new run of sequence numbers
        if request.seed is not None:
            self.randomness = DecisionRandomness(request.seed)
        return Synced(seq=request.seq, committed_len=len(self.committed))

    def close(self) -> None:
        """Free the KV cache now: a llama.cpp context holds its memory until it is freed."""
        release = getattr(self.backend, "release", None)
        if release is not None and self.cache is not None:
            release(self.cache)
        self.cache = None
        self._closed = True
        give_back_free_memory()

    def _check_committed(self, committed_len: int) -> None:
        if committed_len != len(self.committed):
            raise SessionError(
                "stale_state",
                f"the client believes {committed_len} tokens are committed, the service "
                f"holds {len(self.committed)}; send Sync with the full history")

    def _check_seq(self, seq: int) -> None:
        if seq != self.last_seq + 1:
            raise SessionError(
                "bad_seq", f"sequence number {seq} out of order: expected {self.last_seq + 1}; send Sync")

    def check_tokens(self, tokens: list[int], field: str) -> None:
        """SessionError bad_token if an id is outside the target's vocabulary."""
        vocab = self.backend.vocab_size
        if not tokens or (min(tokens) >= 0 and max(tokens) < vocab):  # one pass each in C, not a loop here
            return
        token = next(token for token in tokens if not 0 <= token < vocab)
        raise SessionError("bad_token", f"token id {token} in {field} is out of range [0, {vocab})")

    def _checked_dists(self, request: Verify) -> list[SparseDist]:
        """Validate the draft distributions and renormalise them (q must sum to 1)."""
        if len(request.draft_dists) != len(request.draft):
            raise SessionError(
                "bad_dists", f"sampling needs one draft distribution per draft token: got "
                f"{len(request.draft_dists)} for {len(request.draft)} tokens")
        checked = []
        for i, (token, dist) in enumerate(zip(request.draft, request.draft_dists)):
            if len(dist.ids) != len(dist.probs) or not dist.ids:
                raise SessionError("bad_dists", f"draft distribution {i}: ids and probs differ in length or are empty")
            self.check_tokens(dist.ids, f"draft_dists[{i}]")
            probs = dist.probs
            if any(not math.isfinite(p) or p < 0.0 for p in probs) or not 0.0 < sum(probs) < math.inf:
                raise SessionError("bad_dists", f"draft distribution {i}: probabilities must be finite and >= 0")
            if len(set(dist.ids)) != len(dist.ids):
                raise SessionError("bad_dists", f"draft distribution {i}: repeated token ids")
            try:
                q_token = probs[dist.ids.index(token)]
            except ValueError:
                q_token = 0.0
            if q_token <= 0.0:
                raise SessionError("bad_dists", f"draft token {token} at position {i} has no mass in its distribution")
            total = sum(probs)
            checked.append(SparseDist(ids=dist.ids, probs=[p / total for p in probs]))
        return checked


class _WarpedRows:
    """A block's target distributions, row i warped from the logits the first time it is read."""

    def __init__(self, logits: np.ndarray, sampling: SamplingParams):
        self._logits, self._sampling, self._rows = logits, sampling, {}

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self._rows:
            self._rows[i] = warp(self._logits[i], self._sampling)
        return self._rows[i]
