"""The default generation: the service streams, the drafter guesses ahead, the next pass verifies.

The service generates as it does alone (`--mode server`): a forward pass after another,
each committing the target's next token, streamed back as it is made. Nothing waits for
the drafter. Meanwhile the client guesses the tokens ahead of what it has received (a
chain of guesses, sent in Draft frames as they are made) and the service's next pass
verifies the guesses that have arrived: those for positions the stream has passed are
compared with what it committed, those past its end are fed to the pass, and each one that
equals the target's own pick there is committed before the target's next token. A pass
that keeps g guesses commits g + 1 tokens for about the price of one on a GPU; the round
trip is never on the critical path, because the stream does not wait for it.

The text is the target's alone, token for token, whatever was guessed: the target's pick at
a position is its argmax, or under sampling the winner of the race of its warped
distribution over clocks keyed by (seed, position) (wire/randomness.py); a guess is kept
only where it equals that pick. The drafter guesses by running the same race over its own
distribution (it knows the seed: one is made here when the user gives none, and the service
is told it), which makes its guesses right about as often as rejection sampling would accept
them, and makes a seeded reply the same with or without drafting, at any round trip.

When the drafter works is `StreamController`'s decision (local_draft/stream_controller.py):
only while drafting raises the stream's rate. Resting, it reads nothing: the stream is then
`--mode server` exactly.

Until a reply's first frame comes, the drafter's steps run on a thread beside a watch on the socket
(local_draft/first_frame.py): the first token is shown when it arrives, not after the step under way.

Where the service verifies trees (its Welcome's `trees`) and the controller finds that a tree pays
(`width` above 1: the drafter decodes several branches for little more than one), the guesses
are a tree instead (local_draft/draft_tree.py): grown a level at a time, each level's branches
decoded together, and sent whole. The text is the same: the service keeps a child only where it
is the target's own pick. Otherwise, and wherever trees do not pay, the chain is as it always was.

Who guesses is the `drafting` setting: the draft model ("model"), the n-gram copy of the
context with no model ("ngram"), or per chain whichever has been right more often ("mixed").
A lost service is handled as the round-based loop handles it (local_draft/speculator.py):
the link reconnects (to any replica: the new session is rebuilt from the whole history), and
for up to `takeover_wait_s` the stream waits for it; past that the draft model goes on alone,
unverified ("offline"), until the link is back. With no model, the loss is waited for
(`resume_within_s`), then is an error.

With a grammar (a JSON schema: wire/grammar.py) the Generate carries it and the service masks
the target's logits with it; the drafter masks its own with the same grammar, so that its
guesses stay inside it (offline tokens too). A service that cannot apply one (its Welcome
names no grammar kinds) is refused the request: never unconstrained text in its place.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import msgspec
import numpy as np

from local_draft.draft_model import DraftModel, DraftModelError
from local_draft.draft_source import drafter_and_end_ids
from local_draft.draft_tree import DraftTree
from local_draft.first_frame import FirstFrameWatch, FrameFirst
from local_draft.generation_stats import Generation, GenerationStats
from local_draft.history_rewind import opening
from local_draft.ngram_draft import NGramDrafter
from local_draft.service_link import ServiceLink
from local_draft.speculator import FixedLink, OnCommit, ShouldStop
from local_draft.stream_controller import MARGIN, StreamController
from local_draft.verify_client import ServiceUnreachable, VerifyClient, VerifyError
from wire import grammar as grammars
from wire.protocol import Cancel, Draft, Generate, Generated, Grammar, SamplingParams, Sync, TokenLogprobs
from wire.randomness import DecisionRandomness, draft_generator, fresh_seed
from wire.limits import MAX_TREE_DEPTH
from wire.threads import physical_cores

log = logging.getLogger(__name__)

STOP_REASONS = {"cancelled": "stopped"}  # the service's word -> the loop's
INTERRUPTED = ("going_away", "lost")  # the stream ended before its end: continue on a new connection
MIN_SEND_INTERVAL_S = 0.002  # guesses made faster than this go out together (a service counts frames)
STOP_POLL_S = 0.05  # waiting for a frame, a stop asked by the user is seen within this
NGRAM_MIN_MATCH = 2  # shorter matches (a common token) guess badly: not sent in "mixed"
MAX_FORCED_AHEAD = 32  # a grammar's forced tokens are guessed at most this far ahead (the service's longest block)
SOURCE_MEMORY = 0.9  # "mixed": the weight of the past in each drafter's record of right guesses


class GrammarUnsupported(RuntimeError):
    """The service cannot apply the generation's grammar: the request is refused, not run unconstrained."""


@dataclass
class GuessChain:
    """The client's guesses for the positions after its received history."""

    number: int  # the service tells chains apart by it
    start: int  # position of tokens[0]: the received history's length
    tokens: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # who guessed each ("model" or "ngram")
    sent: int = 0  # tokens[:sent] are at the service (or on their way)

    @property
    def levels(self) -> int:
        return len(self.tokens)

    def advance(self, committed: list[int]) -> tuple[int, int]:
        """Tokens were committed at `start`: drop the guesses they confirm. Returns (right, tested):
        how many guesses they confirmed and how many they tested (one more when one was wrong)."""
        right = 0
        while right < min(len(committed), len(self.tokens)) and self.tokens[right] == committed[right]:
            right += 1
        tested = right + (1 if right < min(len(committed), len(self.tokens)) else 0)
        return right, tested


class StreamSpeculator:
    """The default mode's loop: one Generate a reply (more after a lost service), guesses as it runs."""

    def __init__(self, draft: DraftModel | None, link: ServiceLink | VerifyClient | None, params: SamplingParams,
                 seed: int | None = None, max_block: int | None = None, drafting: str = "model",
                 end_ids: Iterable[int] | None = None, resume_within_s: float = 0.0,
                 takeover_wait_s: float | None = None,
                 colocated: bool | None = None,
                 grammar: Grammar | None = None, logprobs: int = -1, trees: bool = True,
                 tree_width: int | None = None):
        self.draft, self.end_ids = drafter_and_end_ids(draft, drafting, end_ids)
        self.logprobs = logprobs  # -1: none; n: the target's log probability of each token and its n most likely
        self.token_logprobs: list[TokenLogprobs | None] = []  # the generation's, one per token (None: made offline)
        self.grammar = grammar  # each generation's output is constrained by it (its start: where that begins)
        self._grammar_at: Grammar | None = None  # the running generation's, with its start
        self._constraint: grammars.TokenConstraint | None = None  # the drafter's copy of it
        # the constrained text begins this many tokens before the reply: the context's last tokens
        # are the grammar's already (a call opened in the prompt), and the service checks them
        self.grammar_lead = 0
        self.guess_forced = True  # guess the grammar's forced tokens without the drafter (off: benchmarks compare)
        self._forced_at: tuple[int, int] | None = None  # (chain, position) whose forced tokens were last added
        self.drafting = drafting
        self.ngram = NGramDrafter() if drafting != "model" else None
        self.link = FixedLink(link) if isinstance(link, VerifyClient) else link  # None: offline
        self.params = params
        self.resume_within_s = resume_within_s  # with no model: how long a lost service is waited for
        # with one: how long, before the first offline token of an outage (None: as the link says)
        self.takeover_wait_s = takeover_wait_s
        self._waited_offline = False  # this outage's wait is spent
        self.colocated = colocated  # the service shares this machine's cores; None: by its address (loopback)
        self.allow_trees = trees  # False: chains only, whatever the service verifies (benchmarks compare the two)
        # The race's clocks are keyed by the session's seed: the drafter needs it to guess, so
        # there is always one, made here when the user gives none (greedy needs no clocks).
        self.seed = seed if seed is not None else fresh_seed()
        self.randomness = DecisionRandomness(self.seed)
        self.rng = draft_generator(self.seed)  # offline tokens only
        # tree_width: every tree that width, wherever trees are verified (benchmarks compare shapes);
        # None: the controller chooses by the costs and the measured rates
        self.controller = StreamController(max_block=max_block, pinned_width=tree_width)
        self._share_of_cores: float | None = None  # read once, when a service shares this machine (from sysfs)
        self.controller.new_reply()
        self.stats = GenerationStats()
        self._client: VerifyClient | None = None  # the connection _service_history refers to
        self._service_history: list[int] = []
        self._keyed: VerifyClient | None = None  # the connection known to draw with self.seed
        self._seq = 0
        self._chains = 0
        self._trees = False  # this stream may guess trees (_consider_trees)
        self._blind: int | None = None  # passes without a guess since the last miss (None: not counting)
        self._mixed_right = {"model": [0.7, 1.0], "ngram": [0.5, 1.0]}  # decayed right / tested, by source
        # while a reply's first frame is awaited, the drafter's steps run beside a watch on the socket
        # (local_draft/first_frame.py): the pool's two threads, made at the first such reply
        self._first_frame_pool: ThreadPoolExecutor | None = None
        self._watch: FirstFrameWatch | None = None

    # ---- settings -----------------------------------------------------------------------

    @property
    def k(self) -> int | None:
        """The longest chain of guesses ahead of the stream (None: as costs say, 0: no drafting)."""
        return self.controller.max_block

    def set_k(self, k: int | None) -> None:
        if k is not None and k < 0:
            raise ValueError(f"k must be 0 or more, got {k}")
        self.controller.max_block = k
        self.controller.new_reply()  # a setting takes effect at once

    @property
    def max_draft(self) -> int | None:
        return self.link.welcome.max_draft if self.link is not None else None

    def reseed(self, seed: int) -> None:
        """Draw from `seed` from the next generation on, as a new session with that seed would."""
        self.seed = seed
        self.randomness = DecisionRandomness(seed)
        self.rng = draft_generator(seed)
        self._keyed = None

    # ---- generating -------------------------------------------------------------------

    def generate(self, context: Sequence[int], max_tokens: int, on_commit: OnCommit | None = None,
                 should_stop: ShouldStop | None = None) -> Generation:
        """Continue `context` by up to max_tokens tokens (fewer at an end token, a full context or a stop)."""
        stats = self.stats = GenerationStats()
        history, new = list(context), []
        self.token_logprobs = []
        self._constrain_from(len(history) - self.grammar_lead)
        reason = "max_tokens"
        while len(new) < max_tokens:
            if should_stop is not None and should_stop():
                reason = "stopped"
                break
            client = self.link.current() if self.link is not None else None
            if client is None:
                reason = self._without_service(history, new, max_tokens, on_commit)
                if reason != "more":
                    break
                continue
            if client is not self._client:
                self._use(client)
            try:
                reason = self._stream(client, history, new, max_tokens, on_commit, should_stop)
            except ServiceUnreachable as exc:
                self._forget_client()
                if self.link is None:
                    raise
                if self.link.current() in (client, None):  # not if the link already has a newer connection
                    self.link.lost(str(exc))  # a bare client (FixedLink) raises here
                reason = "lost"
            if reason not in INTERRUPTED:
                break
        stats.wall_s = time.perf_counter() - stats.started_at
        return Generation(new, STOP_REASONS.get(reason, reason), stats)

    def _constrain_from(self, start: int) -> None:
        """Constrain the generation's tokens from position `start` by the grammar, if there is one."""
        if self.grammar is None:
            self._grammar_at = self._constraint = None
            return
        self._grammar_at = msgspec.structs.replace(self.grammar, start=start)
        self._constraint = None
        if self.draft is not None:
            draft = self.draft
            vocab = grammars.vocab_for(draft.vocab_fingerprint, n_vocab=draft.vocab_size,
                                       load=lambda: [draft.token_text(i) for i in range(draft.vocab_size)])
            self._constraint = grammars.TokenConstraint(self._grammar_at, vocab, self.end_ids)

    def _allowed(self, context: list[int]) -> np.ndarray | None:
        """The grammar's mask for the token after `context` (None: no grammar, or a context that
        left it, an n-gram guess's: the drafter then guesses freely, and the service refuses it)."""
        if self._constraint is None or not self._constraint.follow(context[self._grammar_at.start:]):
            return None
        return self._constraint.allowed(self.draft.vocab_size)

    def _stream(self, client: VerifyClient, history: list[int], new: list[int], max_tokens: int,
                on_commit: OnCommit | None, should_stop: ShouldStop | None) -> str:
        """One Generate and its stream, guessing ahead while it runs; returns the stop reason."""
        if self._grammar_at is not None and self._grammar_at.kind not in client.welcome.grammars:
            raise GrammarUnsupported(
                f"the verification service ({client.welcome.target or 'unnamed target'}) cannot apply a "
                f"{self._grammar_at.kind} grammar: it runs an older specwire, or one without llguidance")
        stats = self.stats
        sent0, received0 = client.bytes_sent, client.bytes_received
        self.controller.curve = client.welcome.pass_costs
        self.controller.colocated = client.on_this_machine if self.colocated is None else self.colocated
        self.controller.drafter_share = self._drafter_share() if self.controller.colocated else 0.0
        self._blind = None  # a new stream: its first passes wait for the prompt, not for a miss
        can_draft = "drafts" in client.welcome.capabilities and (self.draft is not None or self.ngram is not None)
        # Beside a service on this machine the drafter reads nothing during the prompt's pass: it
        # would take the cores that pass runs on (the first token would come later).
        early = not self.controller.colocated
        seq = self._start(client, history, max_tokens - len(new))
        # The reply's decisions (whether to draft, how wide) are made once the Generate is out: they do
        # not change what it asks, and the first token is a round trip away. Made before it, they held
        # every reply's request back by their time (the emulated 70B at 32 users: 0.4 emulated ms at the
        # median, 2 at p90, in users that share cores).
        self.controller.new_reply()
        self._consider_trees(client, history, can_draft)
        if can_draft and early and self.draft is not None:
            self._watch = FirstFrameWatch(client, self._first_frame_threads())
        started = time.perf_counter()
        chain = self._new_chain(len(history))
        last_frame_at, frames, cancelled, pause_until, last_send = 0.0, 0, False, 0.0, 0.0
        rebuilt = False
        try:
            while True:
                drafting = (can_draft and (frames > 0 or early) and not cancelled and self.controller.drafting
                            and time.perf_counter() >= pause_until)
                if (self.guess_forced and self._constraint is not None and can_draft and (frames > 0 or early)
                        and not cancelled and time.perf_counter() >= pause_until and isinstance(chain, GuessChain)):
                    self._add_forced(history, chain)  # free guesses, whether or not the model drafts now
                horizon = self.controller.horizon(stats.tokens_per_s) if drafting else 0
                if isinstance(chain, DraftTree):
                    horizon = min(horizon, MAX_TREE_DEPTH)  # a deeper tree is refused (wire/limits.py)
                # nor past the reply's last token: the stream ends there, and a guess beyond it
                # would only take the drafter's time
                horizon = min(horizon, max_tokens - len(new))
                if isinstance(chain, DraftTree):
                    chain.limit(horizon, self.end_ids)  # leaves short of the horizon grow, deeper ones wait
                    wants_guess = drafting and bool(chain.open)
                else:
                    wants_guess = drafting and chain.levels < horizon
                if not wants_guess and chain.sent < len(chain.tokens):
                    self._send(client, seq, chain)  # before waiting: what was guessed goes out
                watched = self._watch is not None and self._watch.waiting  # the socket is the watch's
                if not wants_guess and not cancelled and should_stop is not None:
                    cancelled = self._wait_or_cancel(self._watch.wait if watched else client.wait_ready,
                                                     client, seq, should_stop)
                if watched and not wants_guess:
                    self._watch.finish()  # the receive below reads the socket (a silent service is pinged)
                try:
                    frame = None if watched and wants_guess else client.next_generated(wait=not wants_guess)
                except VerifyError as exc:
                    if frames == 0 and exc.code in ("stale_state", "bad_seq") and not exc.fatal and not rebuilt:
                        # the service lost track of us: a Sync gives it our history (and starts its
                        # sequence numbers afresh), once; refused again, the error is the caller's
                        rebuilt = True
                        self._sync(client, history)
                        seq = self._start(client, history, max_tokens - len(new))
                        chain = self._new_chain(len(history))
                        continue
                    if exc.fatal or frames == 0:
                        raise
                    # a refused Draft (its rate, a malformed chain): the stream goes on without guesses a while
                    log.info("the service refused a draft: %s", exc)
                    pause_until = time.perf_counter() + max(exc.retry_after_s, 0.5)
                    chain = self._new_chain(len(history))
                    continue
                if frame is not None:
                    now = time.perf_counter()
                    if frames == 0:
                        self.controller.observe_wire(now - started - frame.forward_s - frame.queue_s)
                    elif frame.tokens:
                        self.controller.observe_frame(len(frame.tokens), now - last_frame_at, drafting,
                                                      frame.forward_s, frame.pass_tokens)
                    frames += 1
                    last_frame_at = now
                    chain = self._commit(frame, history, new, chain, on_commit)
                    if self._watch is not None:  # the first frame is shown: from here the loop works as before
                        self._watch.close()
                        self._watch = None
                    if frame.done:
                        self._service_history = list(history)
                        return frame.stop_reason
                elif wants_guess and not self._guess_unless_overtaken(client, history, chain):
                    pause_until = time.perf_counter() + MIN_SEND_INTERVAL_S  # nothing to guess with now
                elif chain.sent < len(chain.tokens) and time.perf_counter() - last_send >= MIN_SEND_INTERVAL_S:
                    self._send(client, seq, chain)
                    last_send = time.perf_counter()
                if not cancelled and should_stop is not None and should_stop():
                    client.send_cancel(Cancel(seq=seq))
                    cancelled = True
        finally:
            if self._watch is not None:
                self._watch.close()
                self._watch = None
            stats.bytes_sent += client.bytes_sent - sent0
            stats.bytes_received += client.bytes_received - received0

    @staticmethod
    def _wait_or_cancel(ready, client: VerifyClient, seq: int, should_stop: ShouldStop) -> bool:
        """Wait for the next frame (`ready(timeout)`: the client's, or the first frame's watch), in
        slices, sending Cancel as soon as a stop is asked (True then). A long pass (a prompt's) is not
        waited out before the stop is sent; past the client's stall timeout the caller's receive takes
        over (it asks the service whether it is alive)."""
        waited = 0.0
        while waited < client.stall_timeout_s and not ready(STOP_POLL_S):
            waited += STOP_POLL_S
            if should_stop():
                client.send_cancel(Cancel(seq=seq))
                return True
        return False

    def _start(self, client: VerifyClient, history: list[int], budget: int) -> int:
        """Send Generate (after a Sync if the service's copy or its seed may differ); returns its seq."""
        rekey = not self.params.greedy and self._keyed is not client and client.hello_seed != self.seed
        known, keep = opening(client, self._service_history, history, rekey, lambda: self._sync(client, history))
        self._keyed = client
        self._seq += 1
        self._service_history = []  # unknown until the stream ends
        start = known if keep == -1 else keep
        client.send_generate(Generate(seq=self._seq, committed_len=known, append=history[start:],
                                      max_tokens=budget, stop_ids=sorted(self.end_ids), grammar=self._grammar_at,
                                      logprobs=self.logprobs, keep=keep,
                                      seed=self.seed if rekey else None))
        self.stats.round_trips += 1
        return self._seq

    def _sync(self, client: VerifyClient, history: list[int]) -> None:
        self._seq += 1
        client.sync(Sync(seq=self._seq, tokens=list(history), seed=None if self.params.greedy else self.seed))
        self._service_history = list(history)
        self.stats.syncs += 1
        self.stats.round_trips += 1

    # ---- what arrives -------------------------------------------------------------------

    def _commit(self, frame: Generated, history: list[int], new: list[int], chain: GuessChain,
                on_commit: OnCommit | None) -> GuessChain:
        """Take a frame's tokens into the history; returns the chain that goes on from them."""
        stats = self.stats
        stats.service_s += frame.forward_s + frame.queue_s
        stats.forward_s += frame.forward_s
        stats.queue_s += frame.queue_s
        tokens = list(frame.tokens)
        if not tokens:
            return chain
        accepted = min(frame.accepted, len(tokens))
        stats.record_round(frame.drafted, accepted, len(tokens))
        stats.last_k = frame.drafted
        if frame.drafted:
            stats.record_source(chain.sources[0] if chain.sources else "model", frame.drafted, accepted)
        if isinstance(chain, DraftTree):
            right, first, alternate, tested, carried = chain.follow(tokens)
            if tested:
                self.controller.observe_tree_levels(first, alternate, tested, chain.width, carried)
        else:
            right, tested = chain.advance(tokens)
            if tested:
                self.controller.observe_guesses(right, tested)
                self._score_sources(chain, right, tested)
        self._count_blind(frame.drafted, tested > right)
        history += tokens
        new += tokens
        if self.logprobs >= 0:
            given = list(frame.logprobs[: len(tokens)])
            self.token_logprobs += given + [None] * (len(tokens) - len(given))
        if on_commit:
            on_commit(tokens, ["draft"] * accepted + ["target"] * (len(tokens) - accepted))
        if right < len(tokens):  # a guess was wrong, or the chain ran out: guess afresh after the new text
            return self._new_chain(len(history))
        if isinstance(chain, DraftTree):
            below = chain.below(right, tokens, chain.number, self.end_ids)
            if below is None or below.width != self.controller.width:
                return self._new_chain(len(history))
            if below.number < 0:  # not all of it had gone out: sent afresh
                below.number = self._next_chain_number()
            return below
        rest = GuessChain(chain.number, len(history), chain.tokens[right:], chain.sources[right:],
                          chain.sent - right)
        if rest.sent < 0:  # guessed right, but not all of it had gone out: the service's copy ends short
            rest.number, rest.sent = self._next_chain_number(), 0
        return rest

    def _count_blind(self, drafted: int, missed: bool) -> None:
        """Count the passes that verified no guess after a miss, until one does: what a miss costs the
        stream, which the controller weighs a tree's width by (`observe_blind`)."""
        if self._blind is not None:
            if drafted:
                self.controller.observe_blind(self._blind)
                self._blind = None
            else:
                self._blind += 1
        if missed:
            self._blind = 0

    def _new_chain(self, start: int) -> GuessChain | DraftTree:
        """Empty guesses after `start`: a tree where one pays now (the controller's width), else a chain."""
        if self._trees and self.controller.choose_width() > 1:
            return DraftTree(self._next_chain_number(), start, self.controller.width)
        return GuessChain(self._next_chain_number(), start)

    def _consider_trees(self, client: VerifyClient, history: list[int], can_draft: bool) -> None:
        """Whether this stream may guess trees: the service verifies them, the drafter is the model and
        decodes branches together; its price for that is measured once (the first such stream)."""
        # under a grammar the drafter's guesses are masked a token at a time, as a chain's are
        self._trees = (self.allow_trees and can_draft and client.welcome.trees and self.drafting == "model"
                       and self._constraint is None
                       and hasattr(self.draft, "branch_guesses") and self.controller.max_block is None)
        self.controller.trees = self._trees
        if self._trees and not self.controller.batch_cost and self.controller.possible_gain(0.9) >= MARGIN:
            try:
                self.controller.batch_cost = dict(self.draft.batch_cost(history))
            except DraftModelError as exc:
                log.info("trees off: the drafter could not decode branches together (%s)", exc)
                self._trees = self.controller.trees = False

    def _next_chain_number(self) -> int:
        self._chains += 1
        return self._chains

    # ---- guessing -----------------------------------------------------------------------

    def _guess(self, client: VerifyClient, history: list[int], chain: GuessChain) -> bool:
        """Extend the chain by one guess (or a copied run); False when there is nothing to guess with.

        A drafter still reading the text reads a piece instead (it stops as a frame arrives)."""
        if self._watch is not None:
            self._watch.settle()  # a step the first frame overtook ends before the drafter is asked anything
        if isinstance(chain, DraftTree):
            return self._grow(client, history, chain)
        context = history + chain.tokens
        if self.ngram is not None and (self.drafting == "ngram" or self._ngram_preferred()):
            proposal = self.ngram.propose(context, 8)
            if proposal.tokens and (self.drafting == "ngram" or proposal.match_len >= NGRAM_MIN_MATCH):
                chain.tokens += proposal.tokens
                chain.sources += ["ngram"] * len(proposal.tokens)
                self.stats.ahead_drafted += len(proposal.tokens)
                return True
            if self.drafting == "ngram":
                return False
        if self.draft.lag(context) > 2:  # a new prompt, or a turn after a rest: read it while frames come
            began = time.perf_counter()
            try:
                self._on_drafter(lambda stop: self.draft.keep_up(context, should_stop=stop), client)
            except DraftModelError:
                return False
            self.stats.ahead_s += time.perf_counter() - began
            return True
        began = time.perf_counter()
        clocks = None if self.params.greedy else self.randomness.race(len(context), self.draft.vocab_size)
        try:
            allowed = self._allowed(context)
            token = self._on_drafter(lambda _: self.draft.guess(context, self.params, clocks, allowed), client)
        except DraftModelError:  # the drafter's context is full: the stream goes on without guesses
            return False
        spent = time.perf_counter() - began
        self.controller.observe_guess_time(spent)
        self.stats.draft_s += spent
        self.stats.ahead_drafted += 1
        chain.tokens.append(token)
        chain.sources.append("model")
        return True

    def _guess_unless_overtaken(self, client: VerifyClient, history: list[int], chain: GuessChain) -> bool:
        """`_guess`, where the first frame may come mid-step: then True (the loop handles the frame next)."""
        try:
            return self._guess(client, history, chain)
        except FrameFirst:
            return True

    def _on_drafter(self, call, client: VerifyClient):
        """A draft model's call (`call(should_stop)`: a reading of text stops between pieces when it
        says so): beside the first frame's watch while there is one, else here."""
        watch = self._watch
        if watch is None or not watch.waiting:
            return call(client.reply_ready)
        return watch.run(lambda: call(watch.came))

    def _first_frame_threads(self) -> ThreadPoolExecutor:
        if self._first_frame_pool is None:
            self._first_frame_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="specwire-first-frame")
        return self._first_frame_pool

    def _add_forced(self, history: list[int], chain: GuessChain) -> None:
        """Append the tokens the grammar forces after the chain (its syntax: `{"`, a property's name,
        `":`): guesses that cost no drafter pass, sent whether or not the controller drafts. Each
        end of a chain is looked at once."""
        end = (chain.number, chain.start + len(chain.tokens))
        if end == self._forced_at or len(chain.tokens) >= MAX_FORCED_AHEAD:
            return
        self._forced_at = end
        if not self._constraint.follow((history + chain.tokens)[self._grammar_at.start:]):
            return  # the chain left the grammar (an n-gram guess): the service will refuse it anyway
        forced = self._constraint.forced()[: MAX_FORCED_AHEAD - len(chain.tokens)]
        if forced:
            chain.tokens += forced
            chain.sources += ["model"] * len(forced)
            self.stats.ahead_drafted += len(forced)
            self.stats.forced_guesses += len(forced)

    def _grow(self, client: VerifyClient, history: list[int], tree: DraftTree) -> bool:
        """Add a level to the tree, its open branches decoded together; False when none is open."""
        if not tree.open:
            return False
        if self.draft.lag(history) > 2 and not tree.tokens:  # read a new text first, while frames come
            began = time.perf_counter()
            try:
                text = list(history)  # the loop may append to history meanwhile (a frame overtaking the read)
                self._on_drafter(lambda stop: self.draft.keep_up(text, should_stop=stop), client)
            except DraftModelError:
                return False
            self.stats.ahead_s += time.perf_counter() - began
            return True
        began = time.perf_counter()
        clocks_for = (lambda position: None) if self.params.greedy else (
            lambda position: self.randomness.race(position, self.draft.vocab_size))
        branches = len(tree.open)
        try:
            text, paths = list(history), tree.open_paths()
            candidates = self._on_drafter(
                lambda _: self.draft.branch_guesses(text, paths, self.params, clocks_for), client)
        except DraftModelError:  # the drafter's context is full: the stream goes on without guesses
            return False
        added = tree.grow(candidates, self.end_ids)
        self.controller.observe_level(tree.wanted)
        spent = time.perf_counter() - began
        self.controller.observe_guess_time(spent / self.controller.batch_cost.get(branches, branches))
        self.stats.draft_s += spent
        self.stats.ahead_drafted += added
        return added > 0

    def _send(self, client: VerifyClient, seq: int, chain: GuessChain | DraftTree) -> None:
        if isinstance(chain, DraftTree):  # a tree goes whole: it replaces the one the service holds
            tokens, parents = chain.likeliest_first()
            client.send_draft(Draft(seq=seq, chain=chain.number, start=chain.start, tokens=tokens, source="model",
                                    parents=parents))
            chain.sent = len(chain.tokens)
            return
        unsent = chain.tokens[chain.sent:]
        source = chain.sources[chain.sent] if chain.sources else "model"
        client.send_draft(Draft(seq=seq, chain=chain.number, start=chain.start + chain.sent, tokens=unsent,
                                source=source))
        chain.sent = len(chain.tokens)

    def _ngram_preferred(self) -> bool:
        """In "mixed": the copy's guesses have been right at least as often as the model's."""
        model, ngram = self._mixed_right["model"], self._mixed_right["ngram"]
        return ngram[0] / ngram[1] >= model[0] / model[1]

    def _score_sources(self, chain: GuessChain, right: int, tested: int) -> None:
        for i in range(tested):
            counts = self._mixed_right.get(chain.sources[i])
            if counts is not None:
                counts[0] = counts[0] * SOURCE_MEMORY + (1.0 if i < right else 0.0)
                counts[1] = counts[1] * SOURCE_MEMORY + 1.0

    # ---- without a service --------------------------------------------------------------

    def _without_service(self, history: list[int], new: list[int], max_tokens: int,
                         on_commit: OnCommit | None) -> str:
        """No service now: one unverified token from the draft model ("more" to go on); with no
        model, wait for the link up to resume_within_s, then ServiceUnreachable."""
        if self.draft is None:
            if not self._wait_for_link(self.resume_within_s):
                raise ServiceUnreachable(
                    "the verification service is unreachable, and n-gram drafting (--draft ngram) has no "
                    "local model to continue offline" + (f" (waited {self.resume_within_s:g} s for it to "
                                                          "come back)" if self.resume_within_s else ""))
            return "more"
        if not self._waited_offline:
            # once an outage: a replica behind a load balancer takes the session over in a moment,
            # and every token it verifies is the target's, where an offline one may not be
            self._waited_offline = True
            wait_s = self._takeover_wait_s()
            if self.link is not None and wait_s > 0 and self._wait_for_link(wait_s):
                return "more"
            if self.link is not None and wait_s > 0:
                log.warning("no verification service after %.1f s: continuing offline with the local model "
                            "(unverified tokens, marked)", wait_s)
        began = time.perf_counter()
        try:
            tokens, _ = self.draft.propose(history, 1, self.params, self.rng, cap=None, allowed=self._allowed(history))
        except DraftModelError:
            return "context"
        self.stats.draft_s += time.perf_counter() - began
        self.stats.record_round(0, 0, 1)
        self.stats.offline += 1
        history += tokens
        new += tokens
        if self.logprobs >= 0:
            self.token_logprobs.append(None)  # the target's are not known: never the drafter's in their place
        if on_commit:
            on_commit(tokens, ["offline"])
        if tokens[0] in self.end_ids:
            return "eos"
        return "more" if len(new) < max_tokens else "max_tokens"

    # ---- the connection -----------------------------------------------------------------

    def _drafter_share(self) -> float:
        """The share of this machine's physical cores the drafter works on (the n-gram drafter's
        lookups take next to nothing)."""
        if self._share_of_cores is None:
            if self.draft is None or self.drafting == "ngram":
                self._share_of_cores = 0.0
            else:
                self._share_of_cores = min(1.0, self.draft.n_threads / physical_cores())
        return self._share_of_cores

    def _use(self, client: VerifyClient) -> None:
        """A new connection is a new, empty session."""
        self._client, self._service_history, self._seq = client, [], 0
        self._waited_offline = False

    def _takeover_wait_s(self) -> float:
        if self.takeover_wait_s is not None:
            return self.takeover_wait_s
        return getattr(self.link, "takeover_wait_s", 0.0)

    def _wait_for_link(self, within_s: float) -> bool:
        """Whether there is a link and it has a connection within `within_s`."""
        return self.link is not None and self.link.wait_connected(within_s)

    def _forget_client(self) -> None:
        self._client, self._service_history, self._seq = None, [], 0
