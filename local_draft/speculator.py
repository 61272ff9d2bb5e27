"""The speculation loop: draft k tokens, have the service verify them, commit, repeat.

The client holds the whole history; the service holds a copy it extends each round. When
the two could differ (a reply cut at EOS, a new turn, an error) the client sends Sync.
Every committed token is reported with its provenance: "draft" (a draft token the target
accepted), "target" (the target's correction or bonus) or "offline" (unverified).

k is fixed, or chosen each round by `AdaptiveK` (k=None) from measured acceptance and
costs. With adaptive k the first round of a generation drafts nothing: the service reads
the prompt and answers its first token after one round trip, while the drafter reads the
prompt too (and, drafting ahead, guesses that token and drafts the block after it), so the
user sees the first token as soon as with k = 0 and speculation starts on the second round.

With `pipeline=True` the loop drafts ahead while a verdict is in flight: it guesses
the bonus token (the draft's own argmax) and drafts the next block after it; the block is
used only if the verdict accepted the whole current block and its token is the guess, so
the committed text is the same as without drafting ahead.

When the service is lost mid-reply the loop waits up to the link's `takeover_wait_s` for a new
session (another replica's), then goes on offline, one draft token a round, while the
ServiceLink reconnects; the first round on a new connection rebuilds the
service's copy from the client's history, and verification resumes.

What drafts a round is the `drafting` setting (local_draft/draft_source.py): the draft
model ("model"), the n-gram copy of the context with no model at all ("ngram"), or per
round whichever the measured acceptance favours ("mixed"). An n-gram draft is sent with a
point-mass q under sampling, so the acceptance rule stays exact whoever drafted. Without a
model there is no offline fallback: a lost service is waited for (`resume_within_s`), then
is an error.

The drafter samples from its own stream of the seed (wire/randomness.py), never from the
numbers the service decides with; the service's are keyed by the Hello's seed, or by the
seed of the latest `reseed`, which the loop sends (in a Sync) to every new connection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from local_draft.adaptive_k import AdaptiveK, RoundTiming
from local_draft.draft_model import DraftModel, DraftModelError
from local_draft.draft_source import RoundPlan, SourceChoice, drafter_and_end_ids
from local_draft.generation_stats import Generation, GenerationStats
from local_draft.ngram_draft import point_mass
from local_draft.service_link import ServiceLink
from local_draft.verify_client import ServiceUnreachable, VerifyClient, VerifyError
from wire.protocol import SamplingParams, SparseDist, Sync, Verdict, Verify
from wire.randomness import draft_generator

__all__ = ["Generation", "GenerationStats", "Speculator"]

CATCH_UP_TIMED = 2  # a round catches the drafter up by 1-2 tokens; more is a new prompt's prefill
OnCommit = Callable[[list[int], list[str]], None]  # (tokens, provenance of each)
ShouldStop = Callable[[], bool]


def _after_the_first_call(should_stop: Callable[[], bool]) -> Callable[[], bool]:
    """`should_stop`, except that the first call answers False."""
    asked = False

    def stop() -> bool:
        nonlocal asked
        if not asked:
            asked = True
            return False
        return should_stop()

    return stop


class FixedLink:
    """A bare client as a link that never reconnects: losing its service is an error."""

    def __init__(self, client: VerifyClient):
        self.client = client
        self.welcome = client.welcome

    def current(self) -> VerifyClient:
        return self.client

    def lost(self, reason: str) -> None:
        raise ServiceUnreachable(reason)

    def wait_connected(self, within_s: float) -> bool:
        return True


@dataclass
class DraftedAhead:
    """A block drafted while a verdict was in flight: good if `context` is what got committed."""

    context: list[int]  # history + current block + guessed bonus token
    tokens: list[int]
    dists: list[SparseDist]


class Speculator:
    def __init__(self, draft: DraftModel | None, link: ServiceLink | VerifyClient | None,
                 params: SamplingParams, k: int | None = 4, seed: int | None = None,
                 pipeline: bool = False, max_k: int = 16, drafting: str = "model",
                 end_ids: Iterable[int] | None = None, resume_within_s: float = 0.0):
        # "ngram" runs no model: `draft` may be None, and `end_ids` then says where text ends
        self.draft, self.end_ids = drafter_and_end_ids(draft, drafting, end_ids)
        self.choice = SourceChoice(drafting) if drafting != "model" else None
        self.drafting = drafting
        self.resume_within_s = resume_within_s  # with no model: how long a lost service is waited for
        self.link = FixedLink(link) if isinstance(link, VerifyClient) else link  # None: offline
        self.params = params
        self.k = k  # the setting (set_k): draft tokens per round; None: chosen each round (adaptive)
        self.pipeline = pipeline
        self.controller = AdaptiveK(max_k=max_k, pipelined=pipeline)  # learns even when k is fixed
        self.stats = GenerationStats()  # the generation in progress (or the last one), live
        self.rng = draft_generator(seed)
        self._seed: int | None = None  # set by reseed: the service's key to send in a Sync
        self._keyed: VerifyClient | None = None  # the connection that has been sent self._seed
        self._client: VerifyClient | None = None  # the connection _service_history refers to
        self._service_history: list[int] = []  # what the service holds, as far as we know
        self._reading = False  # this round: the drafter is still reading the text (a prompt), not drafting
        self._unrun = 1  # history tokens the service runs before the next block: its last one, or a Sync's new part
        self._seq = 0
        self._bytes_before_client = (0, 0)  # byte counts of connections since replaced
        self._ahead: DraftedAhead | None = None
        self._waited_offline = False  # this outage's takeover wait is spent

    # ---- the draft length -------------------------------------------------------------

    def set_k(self, k: int | None) -> None:
        """Draft k tokens a round from the next round on (None: adaptive); k above the service's
        longest block is drafted at that limit."""
        if k is not None and k < 0:
            raise ValueError(f"k must be 0 or more, got {k}")
        self.k = k

    @property
    def max_draft(self) -> int | None:
        """The service's longest draft block (from its latest Welcome), None without a service."""
        return self.link.welcome.max_draft if self.link is not None else None

    def _round_k(self, remaining: int) -> int:
        """This round's draft length: the setting, within the service's limit and what is left to make."""
        limit = self._client.welcome.max_draft
        if self.k is None:
            return self.controller.choose(remaining, limit)
        return max(0, min(self.k, limit, remaining - 1))  # the service adds one token of its own

    def _plan(self, history: list[int], remaining: int, first: bool) -> RoundPlan:
        """Who drafts this round, and how many tokens."""
        # Adaptive k's first round verifies the prompt alone: drafting first would make the
        # user wait for the drafter's prefill and block before the first token.
        prompt_round = first and self.k is None
        # Nor does it draft while the drafter is still reading (a prompt it read only in part
        # during the first round): that catch-up would stall the round; a round at k = 0 lets
        # it go on reading, in pieces, while the verdict is in flight.
        reading = self.k is None and self.draft is not None and self.draft.lag(history) > CATCH_UP_TIMED
        self._reading = reading and not prompt_round
        model_k = 0 if prompt_round or reading or self.draft is None else self._round_k(remaining)
        if self.choice is None:
            return RoundPlan("model", model_k)
        # The n-gram drafter has no prefill to hide: it may draft in the first round too.
        longest = self.controller.max_k if self.k is None else self.k
        cap = max(0, min(longest, self._client.welcome.max_draft, remaining - 1))
        return self.choice.plan(history, self.controller, self.k, model_k, cap)

    def reseed(self, seed: int) -> None:
        """Start both random streams afresh from `seed`, as a new Speculator and session would:
        for many independent seeded generations on one connection."""
        self.rng = draft_generator(seed)
        self._seed, self._keyed = seed, None

    # ---- generating -------------------------------------------------------------------

    def generate(self, context: Sequence[int], max_tokens: int, on_commit: OnCommit | None = None,
                 should_stop: ShouldStop | None = None) -> Generation:
        """Continue `context` by up to max_tokens tokens (fewer at EOS, a full context or a stop)."""
        history = list(context)
        new: list[int] = []
        stats = self.stats = GenerationStats()
        self.controller.new_reply()
        self._use_current_client()  # so that the byte counts start after any handshake
        sent0, received0 = self._byte_counts()
        stop_reason = "max_tokens"
        while len(new) < max_tokens:
            if should_stop is not None and should_stop():
                stop_reason = "stopped"
                break
            try:
                committed, provenance = self._round(history, max_tokens - len(new), stats, first=not new)
            except DraftModelError:
                stop_reason = "context"
                break
            except VerifyError as exc:
                if exc.code != "context_full":
                    raise
                stop_reason = "context"  # the service's context limit is below the drafter's
                break
            if not committed:  # no model, no service yet: the round waited for it to come back
                continue
            ends = [i for i, token in enumerate(committed) if token in self.end_ids]
            if ends:  # EOS, or another end-of-generation token (Qwen: <|endoftext|> beside <|im_end|>)
                committed, provenance = committed[: ends[0] + 1], provenance[: ends[0] + 1]
                stop_reason = "eos"
            history += committed
            new += committed
            if on_commit:
                on_commit(committed, provenance)
            if stop_reason == "eos":
                break
        stats.wall_s = time.perf_counter() - stats.started_at
        sent1, received1 = self._byte_counts()
        stats.bytes_sent, stats.bytes_received = sent1 - sent0, received1 - received0
        return Generation(new, stop_reason, stats)

    def _round(self, history: list[int], remaining: int, stats: GenerationStats,
               first: bool = False) -> tuple[list[int], list[str]]:
        """One verified round (or an offline step); returns the committed tokens and their provenance."""
        if not self._use_current_client():
            self._ahead = None
            return self._without_service(history, stats)
        plan = self._plan(history, remaining, first)
        k = plan.k
        prompt_round = first and self.k is None and self.draft is not None and plan.source == "model"
        t0 = time.perf_counter()
        draft, dists, drafted_now = self._draft_block(history, plan, stats)
        draft_s = time.perf_counter() - t0
        stats.draft_s += draft_s
        try:
            request = self._request(history, draft, dists, plan.source)
            sent = time.perf_counter()
            self._client.send_verify(request)
            ahead_room = min(k, remaining - len(draft) - 2)  # the next round's block, if all goes well
            if plan.source == "ngram":  # a block ahead is the model's: of the length it drafts
                ahead_room = min(ahead_room, self.controller.last_choice)
            if prompt_round:  # the drafter reads the prompt (and drafts ahead) while the first token comes
                ahead_room = min(self.controller.last_choice, self.controller.max_k, self._client.welcome.max_draft,
                                 remaining - 2)
                stop = self._prompt_round_stop(sent)
                if self.pipeline and ahead_room > 0:
                    self._draft_ahead(history, ahead_room, stats, stop)
                else:
                    self._keep_drafter_up(history, stop)
            elif self.draft is None:
                pass  # nothing runs here while the verdict is in flight
            elif self.pipeline and ahead_room > 0 and draft and draft[-1] not in self.end_ids:
                self._draft_ahead(history + draft, ahead_room, stats)
            elif not draft and self.k is None and self._reading:
                self._keep_drafter_up(history, self._reading_stop(sent, request), at_least_a_piece=True)
            elif not draft and self.k is None:
                self._keep_drafter_up(history)
            verdict = self._receive_verdict(history, request)
            round_trip = time.perf_counter() - sent
        except ServiceUnreachable as exc:
            self._forget_client()
            self.link.lost(str(exc))  # a FixedLink raises here: no link, no fallback
            # The drafts were sampled for the wire (truncated): draw afresh, as offline does.
            return self._without_service(history, stats)
        committed = draft[: verdict.accepted] + [verdict.token]
        self._service_history = history + committed
        self._keep_ahead_if_right(history + committed)
        if self.choice is not None:
            self.choice.score(committed)  # the n-gram drafter's acceptance, whoever drafted
        self._account(stats, verdict, round_trip, k=len(draft), draft_s=draft_s,
                      drafted_now=drafted_now, fed=self._unrun + len(request.append) + len(draft), source=plan.source)
        self._unrun = 1
        return committed, ["draft"] * verdict.accepted + ["target"]

    # ---- drafting ---------------------------------------------------------------------

    def _draft_block(self, history: list[int], plan: RoundPlan,
                     stats: GenerationStats) -> tuple[list[int], list[SparseDist], int]:
        """The plan's k draft tokens after history: the n-gram's, or the model's, starting from a
        block drafted ahead when it fits.

        Returns the tokens, their distributions and how many were drafted just now (0 when
        the time also went into a new prompt: the controller learns drafting costs from it).
        """
        ahead, self._ahead = self._ahead, None
        k = plan.k
        if k == 0:
            return [], [], 0
        if plan.source == "ngram":  # a point mass on each copied token: what it was drawn from
            tokens = plan.proposal.tokens[:k]
            dists = [] if self.params.greedy else [point_mass(token) for token in tokens]
            return self._cut_at_end(tokens, dists) + (0,)
        tokens, dists = [], []
        if ahead is not None and ahead.context == history:
            tokens, dists = ahead.tokens[:k], ahead.dists[:k]
            stats.ahead_used += len(tokens)
        more, more_dists = [], []
        if len(tokens) < k:
            more, more_dists = self.draft.propose(history + tokens, k - len(tokens), self.params, self.rng)
        tokens, dists = tokens + more, dists + more_dists
        if more and self.draft.last_catch_up > CATCH_UP_TIMED:
            drafted_now = 0  # a new prompt's prefill was in that time: not a drafting cost
        else:
            drafted_now = len(more)
        return self._cut_at_end(tokens, dists) + (drafted_now,)

    def _cut_at_end(self, tokens: list[int], dists: list[SparseDist]) -> tuple[list[int], list[SparseDist]]:
        ends = [i for i, token in enumerate(tokens) if token in self.end_ids]
        if ends:  # nothing after an end of text is worth verifying
            tokens, dists = tokens[: ends[0] + 1], dists[: ends[0] + 1]
        return tokens, dists

    def _prompt_round_stop(self, sent: float) -> Callable[[], bool]:
        """When the drafter stops reading the prompt during the first round.

        A service on this machine computes on the drafter's cores: reading the prompt beside
        its prompt pass slowed that pass (the first token came 1.5x later than with k = 0 on
        two cores), so the drafter reads only while the request and the verdict travel (the
        measured wire time), and goes on in the rounds after. A remote service computes
        elsewhere: the drafter reads until the verdict comes, as it does before any wire time
        was measured.
        """
        budget = self.controller.wire_s
        if not self._client.on_this_machine or budget is None:
            return self._client.reply_ready
        return lambda: self._client.reply_ready() or time.perf_counter() - sent >= budget

    def _reading_stop(self, sent: float, request: Verify) -> Callable[[], bool]:
        """While the drafter reads a prompt in k = 0 rounds: stop at the verdict, or before a piece
        that would end after the verdict is expected (a piece of 2 tokens took 51 ms beside a
        60 ms step: starting a second one would hold the verdict 40 ms)."""
        expected = self.controller.verify_s(self._unrun + len(request.append)) + (self.controller.wire_s or 0.0)
        return lambda: (self._client.reply_ready()
                        or time.perf_counter() - sent + self.draft.piece_s > expected)

    def _draft_ahead(self, context: list[int], k: int, stats: GenerationStats,
                     should_stop: Callable[[], bool] | None = None) -> None:
        """While the verdict is in flight: guess the bonus token and draft the block after it."""
        started = time.perf_counter()
        try:
            guess, tokens, dists = self.draft.draft_ahead(context, k, self.params, self.rng,
                                                          should_stop=should_stop or self._client.reply_ready)
        except DraftModelError:  # no room left in the draft's context: the verdict still comes
            return
        stats.ahead_s += time.perf_counter() - started
        stats.ahead_drafted += len(tokens)
        self._ahead = DraftedAhead(context + [guess], tokens, dists) if tokens and guess is not None else None

    def _keep_drafter_up(self, history: list[int], should_stop: Callable[[], bool] | None = None,
                         at_least_a_piece: bool = False) -> None:
        """Adaptive k chose k = 0: feed the drafter this round's context while the verdict flies.

        Otherwise, after many such rounds, the next block would wait for a long catch-up
        (seconds on a CPU) that the controller does not see in its drafting cost.
        """
        should_stop = should_stop or self._client.reply_ready
        if at_least_a_piece:  # still reading a prompt: a service faster than a piece would never let it finish
            should_stop = _after_the_first_call(should_stop)
        elif should_stop():
            return  # a fast service: the catch-up would only delay reading the verdict
        try:
            self.draft.keep_up(history, should_stop=should_stop)  # delays the verdict by one piece at most
        except DraftModelError:  # no room left in the draft's context: the verdict still comes
            pass

    def _keep_ahead_if_right(self, committed_history: list[int]) -> None:
        # The block drafted ahead continues history + block + guess; it is right only if the
        # verdict accepted the whole block and its own token is the guess.
        if self._ahead is not None and self._ahead.context != committed_history:
            self._ahead = None

    def _without_service(self, history: list[int], stats: GenerationStats) -> tuple[list[int], list[str]]:
        """No service now: an offline round with the model; without one, wait for the link to
        reconnect (up to resume_within_s, then ServiceUnreachable) and commit nothing."""
        if self.draft is not None:
            if not self._waited_offline:  # once an outage: a replica may take the session over in a moment
                self._waited_offline = True
                wait_s = getattr(self.link, "takeover_wait_s", 0.0)
                if wait_s > 0 and self.link.wait_connected(wait_s):
                    return [], []
            return self._offline_round(history, stats)
        if self.link is None or not self.link.wait_connected(self.resume_within_s):
            raise ServiceUnreachable(
                "the verification service is unreachable, and n-gram drafting (--draft ngram) has no "
                "local model to continue offline" + (f" (waited {self.resume_within_s:g} s for it to come back)"
                                                      if self.resume_within_s else ""))
        return [], []

    def _offline_round(self, history: list[int], stats: GenerationStats) -> tuple[list[int], list[str]]:
        """The draft model alone, one token from its full distribution: unverified."""
        t0 = time.perf_counter()
        tokens, _ = self.draft.propose(history, 1, self.params, self.rng, cap=None)
        stats.draft_s += time.perf_counter() - t0
        stats.record_round(0, 0, 1)
        stats.offline += 1
        return tokens, ["offline"]

    # ---- the wire ---------------------------------------------------------------------

    def _request(self, history: list[int], draft: list[int], dists: list[SparseDist], source: str) -> Verify:
        """The Verify for this round, after a Sync if the service's copy may differ from ours."""
        known = self._service_history
        if known != history[: len(known)] or (self._seed is not None and self._keyed is not self._client):
            self._sync(history)
            known = self._service_history
        self._seq += 1
        return Verify(seq=self._seq, committed_len=len(known), append=history[len(known):],
                      draft=draft, draft_dists=dists, draft_source=source if draft else "")

    def _receive_verdict(self, history: list[int], request: Verify) -> Verdict:
        try:
            return self._client.receive_verdict()
        except VerifyError as exc:
            if exc.fatal or exc.code not in ("stale_state", "bad_seq"):
                raise
        self._sync(history)  # the service lost track of us: rebuild its copy, retry once
        self._seq += 1
        self.stats.round_trips += 1
        return self._client.verify(Verify(seq=self._seq, committed_len=len(history), draft=request.draft,
                                         draft_dists=request.draft_dists, draft_source=request.draft_source))

    def _sync(self, history: list[int]) -> None:
        self._seq += 1
        self._client.sync(Sync(seq=self._seq, tokens=list(history), seed=self._seed))
        self._keyed = self._client
        # the service keeps the cache of what the old history shares with the new (remote_verify/session.py)
        old, common = self._service_history, 0
        while common < min(len(old) - 1, len(history) - 1) and old[common] == history[common]:
            common += 1
        self._unrun = len(history) - common
        self._service_history = list(history)
        self.stats.syncs += 1
        self.stats.round_trips += 1

    def _account(self, stats: GenerationStats, verdict: Verdict, round_trip: float, k: int,
                 draft_s: float, drafted_now: int, fed: int, source: str) -> None:
        queue_s = getattr(verdict, "queue_s", 0.0)
        service_s = queue_s + verdict.forward_s + verdict.accept_s
        stats.verify_s += round_trip
        stats.service_s += service_s
        stats.queue_s += queue_s
        stats.forward_s += verdict.forward_s
        stats.last_k = k
        stats.last_round_trip_s = max(0.0, round_trip - service_s)
        stats.record_round(k, verdict.accepted, verdict.accepted + 1)
        stats.record_source(source, k, verdict.accepted)
        stats.round_trips += 1
        self.controller.observe(RoundTiming(
            k=k, accepted=verdict.accepted, draft_s=draft_s, draft_tokens=drafted_now, fed_tokens=fed,
            service_s=service_s, wire_s=stats.last_round_trip_s, source=source))

    # ---- the connection ---------------------------------------------------------------

    def _use_current_client(self) -> bool:
        """Follow the link to its live connection; a new one starts with an empty session."""
        client = self.link.current() if self.link is not None else None
        if client is not self._client:
            self._forget_client()
            self._client = client
            if client is not None:
                self._waited_offline = False  # the next outage waits for a takeover again
        return client is not None

    def _forget_client(self) -> None:
        if self._client is not None:
            sent, received = self._bytes_before_client
            self._bytes_before_client = (sent + self._client.bytes_sent, received + self._client.bytes_received)
        self._client = None
        self._service_history = []
        self._seq = 0

    def _byte_counts(self) -> tuple[int, int]:
        sent, received = self._bytes_before_client
        if self._client is not None:
            sent, received = sent + self._client.bytes_sent, received + self._client.bytes_received
        return sent, received
