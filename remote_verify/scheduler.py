"""One device's model work: a single worker thread that serves sessions in turn.

Every forward pass (and every cache allocation or release) of every session goes through
the device's queue, so the model is only ever touched from one thread and the event loop
never blocks on it.

Sessions take turns by the device time they have taken, not by their items: the next item is
that of the waiting session charged least so far, and each run charges its session what a pass
of the tokens it fed costs, in passes of one token (`_charge`: on a CPU about the tokens, on a
GPU a prompt's piece of a hundred tokens about two; the tokens themselves before any pass is
timed; 1 for an item that feeds none), so a session of long feeds waits behind sessions of short
rounds in proportion to what it costs them. A session back from idle starts no more than CREDIT_TOKENS behind the
queue's clock (the charge of the latest session served): it goes first, but cannot bank the
time it was idle. Within a session, items run in arrival order.

Chunked prefill: an item that must first feed a long history (a prompt, a Sync's new
history, a stream after one) runs it in pieces, each a turn of its own (`Shareable.split`):
while other sessions are active, a first piece costs about two one-round passes by the device's
cost curve timed on this queue (before any pass is timed, by the backend's own prices:
`piece_tokens`), or, where that is more, so that its pass beside the other sessions' waiting passes (a
token each) costs at most twice theirs by the curve of passes of as many members (on a GPU's flat curve a
pass of many streams has room for a long piece: sized against one round alone, a piece every other pass
read fewer prompt tokens than users brought); each later one is sized by what the prefill's last piece
added to the rounds' wait, to add about PIECE_ROUNDS passes of rounds (deep in a long history a token
costs more than a curve keyed by tokens says); alone, a piece is as long as llama.cpp's batch
(ALONE_PIECE_TOKENS), or what takes ALONE_PIECE_S where a batch takes longer (a CPU: a newcomer waits for
it). A feed of UNCUT_TOKENS or fewer (a new reply's short prompt) is never cut, nor one of at most a
piece and a half (WHOLE_PIECES): cut, its tail waited a turn of its own, two passes more for its first token (the emulated
7B at 64 users: a prompt of 115 tokens went as 108 and 7; taken whole, the first token's p99 at the
client fell from 0.101 to 0.082 s server-only, from 0.157 to 0.106 s in the default mode), nor, beside streams, a
longer one whose cut would cost its first token more than it spares their pass (`_cut_price`: a cut only moves the
tail's tokens to a later pass, and on a GPU's flat curve spares one gap a few milliseconds). And a round goes before a piece
that is due by charge, once (ROUND_PASSES_BEFORE_A_PIECE), so a round waits behind the one piece
running at most, never behind a whole prefill nor a piece of every prefilling session (by charge
alone, four clients thrashing 4,095-token Syncs made an honest round wait 56 to 100 ms in the
queue at p99, against 0.4 ms quiet; now 1.6 ms), while a prefill still gets every other pass:
after a pass without a piece, the least charged prefill's piece is due (`_piece_due`), however
little a stream is charged (one that began later, credited, is charged less than a session back
with a new reply, whose prompt waited for it to catch up).

Shared passes: an item that is a `Shareable` (a verify round, a server-only stream's next
token) may run in one forward pass with the next item of every other waiting session, at
most one item per session (so the round-robin order is kept: each member goes to the back
of the line) and up to `batch_tokens` tokens fed in all, or `member_tokens` a member where that is more
(a pass of many members: a budget fixed whatever the members leaves each fewer guesses as they come,
where a GPU is least idle). The session whose turn it is always
runs, whatever its size; another joins only if its block fits what is left of the budget, or if it
starts a reply with a prompt its own turn would take whole (`_goes_whole`) while the pass's
new prompts stay within JOIN_PIECES pieces, two such prompts: held out, its first token waited a whole pass
more (the emulated 70B at 32 users under a closed loop: every first token that waited a pass more, 1.3% of
them and the tail its p99 is read from, had a prompt of 112 to 151 tokens held out by the 256-token budget
behind 141 to 156 tokens of streams; on the emulated 32B, asked a reply about every pass and a long prompt
one in four, the slowest first tokens were long prompts held out by another's). The pass it joins costs its
prompt's tokens more, which the next pass, the one it would have waited for, no longer does: its first token
comes a pass sooner, only the first tokens already in the pass come later (by its tokens), and the streams get
as many tokens. New prompts take none of the budget's share for streams and rounds: they once shut 22 streams
out of a pass.
Any other item (loading the model, allocating or freeing a cache, a Sync) runs alone.
Each member is planned (checked, its feed built) before the pass and finished (acceptance,
commit) after it, on this thread, so one session's refusal or failure is its own: a bad
request is refused at planning without touching the pass, and a pass that fails as a whole
is undone and run again one member at a time, so that the error lands on its owner.
`batch_tokens = 0` runs every item alone (`specwire serve --batch-tokens 0`).

Streams (`stream`) keep their next pass waiting at all times: when a pass of a stream
finishes, its next pass is queued on the device thread before the next pass is formed, so
every running stream is in every pass that has room for it. (Queued from the event loop
after the result had travelled there and back, a stream would miss the pass formed in the
meantime, and streams would take turns, each in every other pass.)

Members are planned in turn order, each told what the members before it put in the pass
(`PassSoFar`: tokens and expected commits), so that a stream deciding how many draft tokens
to verify weighs what they cost every member of this pass (remote_verify/stream_drafts.py).
Guesses fill what the budget leaves beside every member's own tokens, and a pass held to a first token's
room what that room leaves, shared out the same way (`_guess_share`): each member at most an even share of
what is left when it is planned, its likeliest guesses, what one leaves going to those after it. Taken first
come, the members planned first each took a long chain of ever less likely guesses and left the rest none;
with each share fixed at the pass's start, the share of a stream whose chain had died at a miss (it waits a
round trip for the client's next: a third of the members of the emulated 70B's passes at 32 users) stayed
unused, and the pass made 3.39 tokens a member where handed on it makes 3.81 (docs/results.md).
Every pass's time is recorded against its tokens in the queue's cost curve (`costs`).

Fairness (`fair`: on in the service, `specwire serve --no-fair-passes` turns it off; off in a bare
queue): each member is also told how
much more than the plain pass (every member's own tokens, no guesses) the pass may cost, by every
member's ledger of gains against a plain stream (remote_verify/pass_ledger.py); guesses fill only
that, so no member pays for another's guesses beyond a small deficit. The plain pass holds the streams
server-only would run under the same users: the members, and where users read between replies, the
further streams its longer replies would keep open (remote_verify/plain_load.py), each priced as a member of
the pass costs, its sequence's own work and not its token alone. While a prompt is read in
pieces (in the pass, or waiting for its next) no room exceeds PREFILL_ROOM: every pass until its first token
delays it, those between its pieces too. And where a session between replies is due to ask while the pass
runs (a program that asks the moment each reply ends: its request lands a round trip into the pass after that
reply's last, and waits out the rest of it; remote_verify/plain_load.py `due`), the pass is held to a first
token's room, as the pass that makes the token is. Whether on or off, a reply's
first token is never left out of a pass for guesses: members are fitted by the tokens they must feed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np

from remote_verify.backends.target import Pass, run_passes
from remote_verify.device_priority import lower_this_thread
from remote_verify.pass_costs import PassCosts
from remote_verify.pass_ledger import PREFILL_ROOM, PassLedger
from remote_verify.pass_trace import PassTrace
from remote_verify.plain_load import PlainLoad
from remote_verify.stream_drafts import PassSoFar
from wire.limits import BATCH_TOKENS, MAX_TREE_NODES, MEMBER_TOKENS

log = logging.getLogger(__name__)

CREDIT_TOKENS = 64  # how far behind the clock a session back from idle starts: ahead of the busy ones
ACTIVE_S = 2.0  # a session that sent work this recently is active: others' prefills go in short pieces
ALONE_PIECE_TOKENS = 512  # a piece when no other session is active: llama.cpp's batch, nothing to share
# ... or fewer, where a batch takes longer than this: a session arriving while a piece runs waits
# for it (512 tokens of the 1.5B target on two CPU cores: 33 s), and a shorter piece costs the
# prefill only the fixed price of a few more passes (about 2% there).
ALONE_PIECE_S = 2.0
DEFAULT_PIECE_TOKENS = 64  # a piece on a backend that measures no prices (torch, onnx)
ROUND_TOKENS = 5  # a typical round's feed (k = 4 and its bonus): what a piece is priced against
ROUND_PASSES_BEFORE_A_PIECE = 1  # passes of rounds that may go before a prefill piece due by charge
PIECE_ROUNDS = 1.0  # a prefill's later pieces take about this many passes of rounds, by their own timing
ROUND_MEMORY = 0.9  # weight of the past in the time of a pass of rounds: about ten passes
# A feed this short is never cut, whatever a piece may cost: a new reply's round (a short prompt and
# its draft) cut into pieces of five waited a turn of every prefilling session for each piece.
UNCUT_TOKENS = 32
# A feed up to this many pieces goes whole in its first turn: the pass costs half a piece more, once,
# where its tail would cost a pass's fixed price, a turn in line and the pass between the two pieces
WHOLE_PIECES = 1.5
# New prompts that join one pass beyond the budget: two prompts that each go whole. Held out, a prompt's first
# token waits the whole next pass; joined, the pass costs its tokens more, which the next pass no longer does
JOIN_PIECES = 2 * WHOLE_PIECES
# The plain streams server-only would run are counted again after this many passes: they follow the users'
# replies, which change over seconds, and counting them costs a millisecond or two at 256 users (a tenth of
# a pass of the emulated 70B target, counted every pass)
PLAIN_LOAD_PASSES = 8


def piece_tokens(backend) -> int:
    """Tokens of a prefill piece while other sessions wait: a piece costs a pass's fixed price twice
    and a round's tokens once (at most two one-round passes), by the prices the backend measures."""
    costs = getattr(backend, "costs", None) if backend is not None else None
    if costs is None:
        return DEFAULT_PIECE_TOKENS
    per_pass, per_token = costs.prices
    if per_token <= 0:
        return ALONE_PIECE_TOKENS
    return int(max(ROUND_TOKENS, min(ALONE_PIECE_TOKENS, ROUND_TOKENS + per_pass / per_token)))


@dataclass
class Planned:
    """A member's share of a pass, and what to do with its result."""

    share: Pass
    finish: Callable[[np.ndarray, float], Any]  # (its result, the pass's seconds) -> the item's result
    undo: Callable[[], None]  # put its cache back as it was before the pass (a failed pass is retried)
    expected: float = 1.0  # tokens it expects to commit (a stream's guesses, weighed by their acceptance)
    # what it committed, appended by `finish` where it knows (a stream's pass): its ledger counts that, not
    # `expected` (shared by copies of the Planned, which a stream's wrapper makes)
    made: list = field(default_factory=list)


@dataclass
class Shareable:
    """Work that may share a forward pass with other sessions': planned on the device thread
    (`plan()` may raise, refusing the request), then run with the others."""

    backend: Any
    plan: Callable[[PassSoFar], Planned]  # told what the pass holds so far (nothing, run alone)
    tokens: Callable[[], int]  # tokens it would feed, read on the device thread to fit the budget
    # (piece, rest) for a feed longer than the given tokens: a prefill piece to run in this turn and
    # the work left for the next one; None when it fits. May raise, refusing the request.
    split: Callable[[int], "tuple[Shareable, Any] | None"] | None = None
    # whether it starts a reply (feeds a prompt, makes a first token): its pass costs what plain streams' would
    starting: Callable[[], bool] | None = None

    def __call__(self) -> Any:
        """Run alone: plan, one pass, finish."""
        so_far = PassSoFar()
        planned = self.plan(so_far)
        so_far.add(planned.share, planned.expected)
        started = time.perf_counter()
        result = run_passes(self.backend, [planned.share])[0]
        return planned.finish(result, time.perf_counter() - started)


@dataclass
class _Item:
    work: Callable[[], Any]  # or a Shareable
    future: asyncio.Future | None  # run(): the caller's future; stream(): None
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.perf_counter)
    session: Hashable = None  # whose it is (set when taken)
    rest: Any = None  # while `work` is a prefill piece: the work that follows it, in a later turn
    ran_s: float = 0.0  # device time of its pieces run so far (not queueing)
    cut: bool = False  # its feed has been cut into pieces: the rest is cut too, however short
    piece_tokens: int = 0  # its last piece's tokens and pass seconds: what its next piece is sized by
    piece_s: float = 0.0
    piece_shared: bool = False  # ... and whether other members were in that pass (the rounds waited only its excess)
    # stream(): called on the device thread with the item's result: the stream's next work (None: it ends)
    follow: Callable[[Any], Any] | None = None
    deliver: Callable[[Any, BaseException | None, float], None] | None = None  # stream(): on the event loop
    answered: bool = False  # its result or error has been handed back (a piece put back in line is not)

    def gone(self) -> bool:
        """Whether nobody waits for it any more (a run() whose caller was cancelled)."""
        return self.future is not None and self.future.cancelled()


class Bookkeeping:
    """Work that runs no forward pass and takes next to no time (starting a stream, a Sync: cache
    truncation and a history): it runs alone, ahead of the line by charge."""

    def __init__(self, work: Callable[[], Any]):
        self.work = work

    def __call__(self) -> Any:
        return self.work()


def _nothing() -> None:
    """The work of an item whose client has gone."""


class _Refused:
    """Work whose planning already failed: raises that error when run."""

    def __init__(self, error: BaseException):
        self.error = error

    def __call__(self):
        raise self.error


class QueueClosed(RuntimeError):
    """The device queue was shut down; no more work is taken."""


class DeviceQueue:
    def __init__(self, name: str = "target", batch_tokens: int = BATCH_TOKENS, costs: PassCosts | None = None,
                 nice: int = 0, member_tokens: int = MEMBER_TOKENS):
        if batch_tokens < 0:
            raise ValueError(f"batch_tokens must be 0 (no shared passes) or more, got {batch_tokens}")
        self.name = name
        self.batch_tokens = batch_tokens
        self.member_tokens = member_tokens  # a pass of many members may feed this many a member (`budget`)
        self.nice = nice  # the worker thread yields the CPU this much to the event loop (device_priority.py)
        self.passes = 0  # forward passes run for Shareable items (shared or alone)
        self.shared_items = 0  # Shareable items run, in all
        self.costs = costs if costs is not None else PassCosts()
        self.busy_s = 0.0  # the device's time in forward passes, since the start
        self.failure: str | None = None  # why the worker stopped, when it failed (the queue is then closed)
        self._ready = threading.Condition()
        self._waiting: dict[Hashable, deque[_Item]] = {}  # per session, in arrival order
        self._turns: deque[Hashable] = deque()  # sessions with work, in the order they came (ties)
        self._charged: dict[Hashable, float] = {}  # tokens each session has fed (its place in line)
        self._clock = 0.0  # the charge of the session served last
        self._seen: dict[Hashable, float] = {}  # when each session last sent work
        self._rounds_ahead = 0  # passes of rounds run before the piece due by charge
        self._pieced = True  # the last pass formed held a prefill's piece (at the start: rounds go first)
        self._prefill_waiting = False  # the pass being formed holds a piece of a prompt, or one waits (`PREFILL_ROOM`)
        self._round_s: float | None = None  # a pass holding no prefill piece takes this long (decayed mean)
        self._piece_memo: dict = {}  # piece limits found while forming the current turn
        self._plain_beside = 0  # other sessions' passes waiting as the turn is formed: a piece's pass holds them too
        self.ledger = PassLedger()  # each session's gain against a plain stream (fair shared passes)
        self.plain_load = PlainLoad()  # the plain streams server-only would run under these users (the ledger's)
        self.plain_streams = 0.0  # ... as last counted (every PLAIN_LOAD_PASSES passes)
        self.trace: PassTrace | None = None  # every pass written down (`specwire serve --trace-passes`)
        # when each session's work came after it had none waiting (a request: a reply's start, a round), until the
        # pass that serves it has run (a stream's start runs none; a prompt's pieces, until the last)
        self._came: dict[Hashable, float] = {}
        self._streams_counted_at: int | None = None  # the pass count then
        # guesses fill only what every member's ledger allows (the service sets it: ServiceConfig.fair_passes,
        # on unless `serve --no-fair-passes`); False: the pass's goodput alone (docs/results.md)
        self.fair = False
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"{name}-worker", daemon=True)
        self._thread.start()

    def budget(self, members: int) -> int:
        """Tokens a shared pass of `members` may feed: `batch_tokens`, or `member_tokens` a member where that
        is more (0: passes are not shared)."""
        return max(self.batch_tokens, self.member_tokens * members) if self.batch_tokens else 0

    @property
    def depth(self) -> int:
        """Items waiting (not counting the one running)."""
        with self._ready:
            return sum(len(items) for items in self._waiting.values())

    async def run(self, session: Hashable, work: Callable[[], Any],
                  arrived: float | None = None) -> tuple[Any, float]:
        """Run `work()` on the device thread in `session`'s turn; returns (its result, seconds queued).

        `arrived` (time.perf_counter) is when the request reached the service; queueing is
        counted from then. An exception raised by `work` is raised here.
        """
        loop = asyncio.get_running_loop()
        item = _Item(work, loop.create_future(), loop, session=session)
        if arrived is not None:
            item.arrived = arrived
        self._put(item)
        try:
            return await item.future
        finally:
            # An exception raised here keeps this frame in its traceback, and the future holds
            # the exception: without this `del` the frame leads back to the future through
            # `item`, a cycle that keeps the request alive until a full garbage collection.
            del item

    def stream(self, session: Hashable, work: Callable[[], Any], follow: Callable[[Any], Any],
               deliver: Callable[[Any, BaseException | None, float], None]) -> None:
        """Run `work` in `session`'s turn, then, as long as `follow(result)` (called on the device
        thread, as soon as the item is finished) gives more work, that work next, queued at once.
        Each item's (result, error, seconds queued) goes to `deliver`, called on the caller's
        event loop. An error ends the stream (follow is not asked)."""
        self._put(_Item(work, None, asyncio.get_running_loop(), session=session, follow=follow, deliver=deliver))

    def _put(self, item: _Item) -> None:
        with self._ready:
            if self._closed:
                raise QueueClosed(f"the {self.name} queue is shut down")
            session = item.session
            items = self._waiting.get(session)
            if items is None:
                items = self._waiting[session] = deque()
                self._turns.append(session)
                self._came.setdefault(session, item.arrived)
                # back from idle: ahead of the busy, by CREDIT_TOKENS at most
                self._charged[session] = max(self._charged.get(session, float("-inf")), self._clock - CREDIT_TOKENS)
            items.append(item)
            if isinstance(item.work, Shareable):  # a round or a step: the session competes for passes
                self._note_seen(session)
            self._ready.notify()

    def shutdown(self, wait: bool = True) -> None:
        """Take no more work; the worker finishes the items already queued, then stops.

        With wait=False the caller does not wait for that (a model still loading at exit:
        the worker is a daemon thread and ends with the process).
        """
        with self._ready:
            self._closed = True
            self._ready.notify()
        if wait:
            self._thread.join()

    def _next(self) -> list[_Item] | None:
        """The next item by charge, with (when it is a Shareable) the next shareable item of every
        other waiting session that fits the token budget; None once closed and empty. A long feed
        is cut: its first piece runs now, the rest waits for the session's next turn."""
        with self._ready:
            while not self._turns:
                if self._closed:
                    return None
                self._ready.wait()
            line = sorted(self._turns, key=lambda each: self._charged[each])  # stable: ties in arrival order
            self._piece_memo.clear()  # the curve has moved since the last turn
            waiting_passes = sum(1 for each in line if isinstance(self._waiting[each][0].work, Shareable))
            self._plain_beside = max(0, waiting_passes - 1)
            # bookkeeping (starting a stream, a Sync) goes first: by charge, a session back with a new
            # reply waited until every stream charged less than it had caught up (a second for a first
            # token at 32 streams); what its turn costs the others is the pass after it, charged as before
            session = next((each for each in line if isinstance(self._waiting[each][0].work, Bookkeeping)), None)
            if session is None:
                session = self._piece_due(line) or self._round_before_piece(line)
            line.remove(session)
            self._turns.remove(session)
            self._clock = max(self._clock, self._charged[session])
            first = self._take(session)
            if isinstance(first.work, Shareable):  # a feed too short to cut needs no piece priced
                self._cut(first, self._turn_limit(first, session))
            taken = [first]
            if isinstance(first.work, Shareable):  # a pass (bookkeeping runs no pass)
                self._pieced = first.rest is not None
                # a prompt read in pieces waits for every pass until its first token, those it is in and
                # those between its pieces: while one does, guesses may lengthen no pass by much
                self._prefill_waiting = self.fair and (first.cut or any(self._prefills(each) for each in line))
            work = first.work
            self._charged[session] += self._charge(self._size(work)) if isinstance(work, Shareable) else 1
            if self.batch_tokens and isinstance(work, Shareable) and hasattr(work.backend, "forward_many"):
                joinable = sum(1 for each in line if _shares_with(self._waiting[each][0].work, work))
                budget = self.budget(1 + joinable)
                prompts = self._size(work) if _starting(work) else 0  # tokens of the pass's new prompts
                left = budget - self._size(work)  # of the budget, for any member
                # ... and for streams and rounds: new prompts do not take it (a prompt that shut 22 streams out of
                # a pass cost each of them a whole pass for its token)
                streams_left = budget - (0 if prompts else self._size(work))
                piece = None  # the turn's prefill piece limit, priced when a second member is considered
                for session in line:
                    queued = self._waiting[session][0]
                    head = queued.work
                    if not _shares_with(head, work):
                        continue  # it keeps its place in line and runs in its own turn
                    starting = _starting(head)
                    if streams_left <= 0 and not starting:
                        continue
                    size = self._size(head)
                    if piece is None:
                        piece = self._piece_limit(first.session, work)
                    # a long feed is cut in its own turn, not here; a new prompt that its own turn would take
                    # whole (`_turn_limit`) may join whole
                    if size > piece and not (starting and not queued.cut and self._goes_whole(size, piece)):
                        continue
                    # a new prompt is not held out by the budget while the pass's prompts stay within
                    # JOIN_PIECES pieces (the module's docstring says why)
                    fits = size <= (left if starting else streams_left)
                    if not fits and not (starting and prompts + size <= JOIN_PIECES * piece):
                        continue
                    self._turns.remove(session)
                    taken.append(self._take(session))
                    self._charged[session] += self._charge(size)
                    left -= size
                    if starting:
                        prompts += size
                    else:
                        streams_left -= size
            return taken

    def _charge(self, tokens: int) -> float:
        """What feeding `tokens` in a pass adds to a session's place in line: the device time of a pass of
        that many, in passes of one token, by passes of one session (on a CPU about the tokens, on a GPU
        a hundred-token piece about two); the tokens while no pass has been timed. Charged its tokens, a
        prompt's first piece on the emulated 7B GPU put its session about a hundred passes behind 64
        streams charged one a pass, and its first token waited 1.7 s at p99 for the second piece."""
        alone = self.costs.shared(1)
        if tokens <= 1 or not alone.known:
            return float(tokens)
        return max(1.0, alone.seconds(tokens) / alone.seconds(1))

    def _piece_due(self, line: list[Hashable]) -> Hashable | None:
        """After a pass without a piece, the least charged session waiting with a prefill (None: none
        waits, or the last pass held one). By charge alone a prefill waited to be the least charged of
        every session, streams too, and a stream that began later is charged less than a session back
        with a new reply: that reply's prompt, too long to join another's pass, waited for it to catch up
        (the emulated 32B at 32 users: a 112-token prompt's first piece 27 passes, 1.2 s, after its
        start)."""
        if self._pieced:
            return None
        prefilling = next((each for each in line if self._prefills(each)), None)  # the line is by charge
        if prefilling is not None:
            self._rounds_ahead = 0
        return prefilling

    def _round_before_piece(self, line: list[Hashable]) -> Hashable:
        """The least-charged session; but when its next item is a prefill (to be cut into a piece) and
        another's is a round (a block, a stream's step), that round's session, ROUND_PASSES_BEFORE_A_PIECE
        times before the piece runs."""
        first = line[0]
        if not self._prefills(first):
            self._rounds_ahead = 0
            return first
        if self._rounds_ahead < ROUND_PASSES_BEFORE_A_PIECE:
            ahead = next((each for each in line[1:] if self._rounds(each)), None)
            if ahead is not None:
                self._rounds_ahead += 1
                return ahead
        self._rounds_ahead = 0
        return first

    def _prefills(self, session: Hashable) -> bool:
        """Whether `session`'s next item is a prefill: a feed that is being cut, or will be."""
        item = self._waiting[session][0]
        work = item.work
        if not isinstance(work, Shareable) or work.split is None:
            return False
        size = self._size(work)
        if size <= UNCUT_TOKENS and not item.cut:  # never cut (`_cut_limit`): no piece to price
            return False
        return size > self._cut_limit(item, self._piece_limit(session, work), session)

    def _turn_limit(self, item: _Item, session: Hashable) -> int:
        """The tokens `item` feeds in the turn it is taking: a short feed, or one that goes whole (`_goes_whole`),
        whole; else a piece (`_cut_limit`)."""
        size = self._size(item.work)
        if not item.cut and size <= UNCUT_TOKENS:
            return UNCUT_TOKENS
        limit = self._cut_limit(item, self._piece_limit(session, item.work), session)
        return size if not item.cut and self._goes_whole(size, limit) else limit

    def _goes_whole(self, size: int, piece: int) -> bool:
        """Whether a feed of `size` tokens not yet cut goes whole rather than as a `piece` and a tail: one of at most
        WHOLE_PIECES pieces always; a longer one where the cut costs its first token more than it spares the
        streams waiting beside it (`_cut_price`)."""
        if size <= WHOLE_PIECES * piece:
            return True
        price = self._cut_price(self._plain_beside, size, piece)
        return price is not None and price[0] <= price[1]

    def _cut_price(self, streams: int, size: int, piece: int) -> tuple[float, float] | None:
        """What cutting a feed of `size` tokens into `piece` now and its tail later spares `streams` plain members
        (a token each) and what it costs the feed's first token, in seconds, by the curve of passes of about as many
        members; None beside fewer than a round's tokens, before the curve is timed, or where the whole feed would
        not leave the streams their tokens in the pass's budget.

        The cut spares the streams' pass the tail's tokens, c(s + size) - c(s + piece), and hands them to a later
        pass: their tokens come no sooner in all, only the one gap is shorter. The feed's first token waits that
        later pass, c(s + size - piece), and at least one pass of the streams between the two (a piece is due
        every other pass), beyond the piece's pass, where whole it would have waited c(s + size). On a GPU's
        flat curve that is a pass or two for a few milliseconds of one gap: the emulated RTX 3090 at 64 users
        asked on a schedule (ten streams a pass) read its 151-token prompts as 92 and 59 where a pass of all
        151 cost 37.9 ms against 29.1, and their first tokens' p99 was 1.23x server-only's, whose 24 streams
        left room for all of it. On a CPU's curve, which rises with every token, the tail spared is dear and
        the cut stays."""
        if streams < ROUND_TOKENS or not self.batch_tokens:
            return None
        room = min(ALONE_PIECE_TOKENS, self.budget(streams + 1) - streams)
        if size > room:
            return None
        key = ("cut", streams, size, piece)
        if key not in self._piece_memo:
            curve = self.costs.shared(streams + 1)
            streams_s, piece_s, whole_s, tail_s = (curve.seconds(streams + n) for n in (0, piece, size, size - piece))
            self._piece_memo[key] = None if None in (streams_s, piece_s, whole_s, tail_s) else \
                (whole_s - piece_s, piece_s + streams_s + tail_s - whole_s)
        return self._piece_memo[key]

    def _cut_limit(self, item: _Item, piece: int, session: Hashable) -> int:
        """The tokens `item` may feed in this turn, `piece` being what the cost curve allows: a feed of
        UNCUT_TOKENS or fewer goes whole; a prefill's later pieces are sized by its own last one, to take
        PIECE_ROUNDS passes of rounds (deep in a long history a token costs more than the curve, keyed by
        tokens alone, says: at 4,000 tokens of the tiny model, attention alone costs a round a token)."""
        if not item.cut:
            return max(piece, UNCUT_TOKENS) if self._size(item.work) <= UNCUT_TOKENS else piece
        if not item.piece_s > 0 or self._round_s is None or not self._others_active(session):
            return piece
        # what the piece added to the rounds' wait: its whole pass, or what that pass took beyond a pass of rounds
        # where they were in it (priced by the whole pass, each piece under load was shorter than the last: the
        # emulated RTX 3090 at 64 users read a 151-token prompt in pieces of 42, 34, 28, ... tokens)
        added_s = item.piece_s - self._round_s if item.piece_shared else item.piece_s
        scaled = item.piece_tokens * PIECE_ROUNDS * self._round_s / max(added_s, 1e-6)
        return int(max(1, min(2 * item.piece_tokens, scaled)))  # twice the last at most: it may have been cheap

    def _rounds(self, session: Hashable) -> bool:
        """Whether `session`'s next item is a pass run whole (a round, a stream's step)."""
        return isinstance(self._waiting[session][0].work, Shareable) and not self._prefills(session)

    def _cut(self, item: _Item, limit: int) -> None:
        """Make `item` run a piece of at most `limit` prefill tokens now, its rest later (when it has more)."""
        work = item.work
        if not isinstance(work, Shareable):
            return
        if item.gone():  # a round whose client is gone (the service cancels on close): not run
            item.work, item.rest = _nothing, None
            return
        if work.split is None:
            return
        parts, error = _attempt(work.split, limit)
        if error is not None:  # the request is refused: its turn reports why
            item.work = _Refused(error)
        elif parts is not None:
            item.work, item.rest = parts
            item.cut = True
        del error, parts

    def _piece_limit(self, session: Hashable, work) -> int:
        """Prefill tokens a piece of `session`'s may feed now: short while others are active, a batch alone."""
        if not self._others_active(session):
            alone = self._longest_piece_within(ALONE_PIECE_S)
            return max(UNCUT_TOKENS, alone) if alone is not None else ALONE_PIECE_TOKENS
        measured = self._measured_piece_tokens()
        return measured if measured is not None else piece_tokens(getattr(work, "backend", None))

    def _others_active(self, session: Hashable) -> bool:
        """Whether another session waits, or sent a round or a step within ACTIVE_S."""
        now = time.monotonic()
        return any(other != session for other in self._turns) or any(
            other != session and now - seen < ACTIVE_S for other, seen in self._seen.items())

    def _measured_piece_tokens(self) -> int | None:
        """The longest piece that costs at most two one-round passes by the passes timed on this queue
        (the device's curve: the emulated one's too, where a backend's own prices are a stand-in's), or,
        where more, the longest whose pass beside the other sessions' waiting passes costs at most two of
        theirs (`_piece_beside`); None before any pass is timed."""
        alone = self._longest_piece_within(2.0, ROUND_TOKENS)
        if alone is None:
            return None
        return max(alone, self._piece_beside(self._plain_beside))

    def _piece_beside(self, streams: int) -> int:
        """The longest piece whose pass with `streams` plain members (a token each) costs at most twice theirs
        alone, by the curve of passes of about as many members; 0 beside fewer than a round's tokens. Within the
        pass's budget, whole prompts of a piece and a half too (WHOLE_PIECES): every member's own token still
        fits. A piece priced against one round alone was about 42 tokens on the emulated RTX 3090, where 42
        tokens more in a pass of 64 streams cost 6 ms of its 26: at 64 users prompts of 97 to 151
        tokens came faster than a piece every other pass read them, in both modes, and their first tokens
        waited (server-only's p99 1.14 s, the default mode's 2.3x that)."""
        if streams < ROUND_TOKENS:
            return 0
        key = ("beside", streams)
        if key not in self._piece_memo:
            curve = self.costs.shared(streams + 1)
            plain_s = curve.seconds(streams)
            room = int(min(ALONE_PIECE_TOKENS, (self.budget(streams + 1) - streams) / WHOLE_PIECES)) \
                if self.batch_tokens else 0
            self._piece_memo[key] = 0 if plain_s is None or room <= 0 else \
                _largest_within(lambda n: curve.seconds(streams + n) <= 2.0 * plain_s, 0, room)
        return self._piece_memo[key]

    def _longest_piece_within(self, seconds: float, rounds_of: int | None = None) -> int | None:
        """The largest n (ROUND_TOKENS to ALONE_PIECE_TOKENS) with c(n) <= `seconds` on the timed curve, or
        <= `seconds` passes of `rounds_of` tokens; None before any pass is timed. Kept for the rest of the
        turn being formed: it is asked for each waiting session, and a search of a curve of a few hundred
        sizes took 0.7 ms, on the device thread between two passes."""
        key = (seconds, rounds_of)
        if key not in self._piece_memo:
            # priced by passes of one session: a piece against one session's round. The curve of every pass
            # mixes in passes of a hundred streams, dearer at the same sizes, and cut prompts into pieces of
            # a few dozen tokens under load (the emulated 70B at 128 users: a first token's p99 2.1 s, not 0.7)
            alone = self.costs.shared(1)
            bound = None
            if alone.known:
                bound = seconds * alone.seconds(rounds_of) if rounds_of else seconds
            self._piece_memo[key] = None if bound is None else \
                _largest_within(lambda n: alone.seconds(n) <= bound, ROUND_TOKENS, ALONE_PIECE_TOKENS)
        return self._piece_memo[key]

    def _note_seen(self, session: Hashable) -> None:
        now = time.monotonic()
        self._seen[session] = now
        if len(self._seen) > 4 * len(self._waiting) + 64:  # forget sessions long quiet (closed, most), and their
            for other, seen in list(self._seen.items()):  # charges: one back after that starts from the clock
                if now - seen > ACTIVE_S and other not in self._waiting:
                    del self._seen[other]
                    self._charged.pop(other, None)
                    self._came.pop(other, None)
                    self.ledger.forget(other)

    def _take(self, session: Hashable) -> _Item:
        """Pop `session`'s next item (its turn is already out of the line)."""
        items = self._waiting[session]
        item = items.popleft()
        if items:
            self._turns.append(session)  # its next item waits for its turn by charge
        else:
            del self._waiting[session]
        item.session = session
        return item

    def _put_back(self, item: _Item) -> None:
        """An item whose piece ran: its rest goes first in its session's line, for the session's next turn."""
        with self._ready:
            item.work, item.rest = item.rest, None
            items = self._waiting.get(item.session)
            if items is None:
                items = self._waiting[item.session] = deque()
                self._turns.append(item.session)
                # back in line mid-feed: its charge may have been forgotten while its piece ran (`_note_seen`
                # forgets sessions quiet for ACTIVE_S that wait for nothing); without one, the next turn's
                # sort raised in the worker thread, which died, and the service answered nobody again
                self._charged.setdefault(item.session, self._clock)
            items.appendleft(item)

    @staticmethod
    def _size(work: Shareable) -> int:
        try:
            return max(1, work.tokens())
        except Exception:  # a request its plan will refuse: let the plan say why
            return 1

    def _serve(self) -> None:
        lower_this_thread(self.nice)  # before the first item: the model loads here, its threads inherit it
        try:
            self._serve_turns()
        except Exception as fault:  # in choosing a turn: the line itself is in doubt, so the queue closes
            self._close_on(fault)

    def _close_on(self, fault: Exception) -> None:
        """The worker failed outside any pass: the queue takes no more work, and every waiting item gets an
        error (they would otherwise wait for ever, and the service answer no one)."""
        log.exception("the %s queue's worker failed (%s: %s): the queue is closed, and the service must be "
                      "restarted", self.name, type(fault).__name__, fault)
        with self._ready:
            self._closed = True
            self.failure = f"{type(fault).__name__}: {fault}"
            waiting = [item for items in self._waiting.values() for item in items]
            self._waiting.clear()
            self._turns.clear()
        for item in waiting:
            item.rest = None
            self._hand_back(item, None, QueueClosed(f"the {self.name} queue failed ({self.failure}): reconnect "
                                                    f"to another replica, or restart the service"), time.perf_counter())

    def _serve_turns(self) -> None:
        while (items := self._next()) is not None:
            turn = list(items)
            try:
                if len(items) == 1 and not isinstance(items[0].work, Shareable):
                    self._run_alone(items[0])
                else:
                    self._run_shared(items)
            except Exception as exc:  # a fault of the queue's own, not of a session's work (that is caught there)
                self._fail_turn(turn, exc)
            del items, turn

    def _fail_turn(self, turn: list[_Item], fault: Exception) -> None:
        """A fault in the queue's own planning or bookkeeping: every item of the turn not yet answered
        gets an error, and the queue goes on (a worker thread that died with it left the service taking
        connections and answering none, deaf even to SIGTERM)."""
        log.exception("the device queue failed on a turn of %d item(s) (%s: %s): they get an error, and the "
                      "queue goes on", len(turn), type(fault).__name__, fault)
        for item in turn:
            if not item.answered:
                item.rest = None
                self._hand_back(item, None, RuntimeError(
                    f"the service failed on this pass ({type(fault).__name__}: {fault}): try again, and "
                    f"report it with the service's log"), time.perf_counter())

    # An exception caught in `_attempt` keeps that frame in its traceback, and a frame keeps its
    # caller's frame (f_back), whose locals outlive its return while the exception lives: each
    # function below that calls `_attempt` ends by dropping its locals, or the item and its
    # future (which holds the exception) would stay in a cycle until a full garbage collection.

    def _run_alone(self, item: _Item) -> None:
        started = time.perf_counter()
        result, error = _attempt(item.work)
        self._hand_back(item, result, error, started)
        del item, result, error

    def _run_shared(self, items: list[_Item]) -> None:
        """Plan every member, run their shares as one pass, finish each; errors stay with their owner."""
        started = time.perf_counter()
        members: list[tuple[_Item, Planned]] = []
        item = planned = error = results = result = value = forward_s = None
        budget = self.budget(len(items)) or float("inf")
        # what the members must feed (their last tokens) comes first; the rest of the budget is shared out
        # (`_guess_share`), so that the members planned first cannot take every guess's place
        if self.fair:  # the members furthest behind plan first: their own guesses count before others' are bounded
            # (and a new reply's first pass before all: it seldom has a guess yet, and its share goes to the others)
            items.sort(key=lambda each: (not _starting(each.work), self.ledger.owed(each.session)))
        sizes = [self._size(item.work) for item in items]
        mandatory = sum(sizes)
        so_far = PassSoFar(budget=budget)
        costs = self.costs.shared(len(items))  # a pass of about this many members (remote_verify/pass_costs.py)
        so_far.costs = costs
        starts = [_starting(item.work) for item in items]
        # the plain pass, and what one more plain stream adds to it (None, 0: fairness off, or a pass of one)
        plain_s, stream_s = self._plain_s(items, mandatory, costs) if self.fair and len(items) > 1 else (None, 0.0)
        rooms = [self.ledger.room(item.session, starting, plain_s) for item, starting in zip(items, starts)]
        # a new reply's request expected while this pass runs waits for it: the pass is held to a first token's room
        due = bool(plain_s) and self._request_due(items, plain_s)
        due_room = self.ledger.first_room(plain_s) if due else float("inf")
        if self._prefill_waiting:  # a first token waits for this pass, in it or after it: a session's first
            rooms = [min(room, PREFILL_ROOM) for room in rooms]  # token is not queued behind others' guesses
        starting_of = {id(item): starting for item, starting in zip(items, starts)}
        # a first token waits for this pass (its own, a prompt's pieces waiting, or a request due): those rooms are
        # held against the pass as it is, and no member's guesses are credited with what they free later
        first = [starting or self._prefill_waiting for starting in starts]
        # what each member's kept guess frees in later passes (remote_verify/plain_load.py `freed`), in seconds
        credits = [0.0 if first[i] or due or not plain_s else self.plain_load.freed(item.session) * stream_s
                   for i, item in enumerate(items)]
        gains: list[float | None] = [None] * len(items)  # planned members' expected kept guesses
        within: dict[float, float] = {}  # the tokens a pass may feed within a first token's room, by that bound
        for i, item in enumerate(items):
            so_far.later_tokens, so_far.later_sessions = sum(sizes[i + 1:]), len(items) - i - 1
            fits = budget  # the tokens this pass may feed
            if plain_s:
                so_far.plain_s, so_far.own_room = plain_s, rooms[i]
                others = [(j, rooms[j] + (gains[j] or 0.0)) for j in range(len(items))
                          if j != i and (j > i or gains[j] is not None)]
                so_far.others_room = min((room for j, room in others if not first[j]), default=float("inf"))
                so_far.first_room = min([due_room] + [room for j, room in others if first[j]])
                if first[i]:  # its own room is a first token's: held against the pass as it is
                    so_far.first_room = min(so_far.first_room, rooms[i])
                    so_far.credit_s = so_far.guess_credit_s = 0.0
                else:
                    so_far.credit_s = sum((gains[j] or 0.0) * credits[j] for j in range(i))
                    so_far.guess_credit_s = credits[i]
                if so_far.first_room < float("inf"):  # the first token's room is shared out among the guesses
                    bound_s = (1.0 + so_far.first_room) * plain_s
                    if bound_s not in within:  # it changes only as a first token's member is planned
                        within[bound_s] = _tokens_within(costs, bound_s, mandatory, budget, len(items))
                    fits = within[bound_s]
            so_far.share = _guess_share(fits, so_far.tokens, sizes[i:])
            planned, error = _attempt(item.work.plan, so_far)
            if error is not None:  # refused before the pass: the others go on
                self._hand_back(item, None, error, started)
            else:
                members.append((item, planned))
                so_far.add(planned.share, planned.expected)
                gains[i] = planned.expected - 1.0
        credit_of = {id(item): credit for item, credit in zip(items, credits)}
        first_tokens = self._first_tokens(items, sizes, starts, members) if self.trace is not None else None
        items.clear()
        ratio = (costs.seconds(so_far.tokens) or plain_s) / plain_s if plain_s and members else None
        # the pass without its guesses, relative to the plain one: no credit makes a pass cheaper than that
        floor = (costs.seconds(mandatory) or plain_s) / plain_s if plain_s and members else None
        if members:
            self.passes += 1
            self.shared_items += len(members)
            began = time.perf_counter()
            results, error = _attempt(run_passes, members[0][0].work.backend,
                                      [planned.share for _, planned in members])
            if error is not None:
                log.warning("a shared pass of %d sessions failed (%s: %s): running them one at a time",
                            len(members), type(error).__name__, error)
                self._run_one_by_one(members, started)
            else:
                ended = time.perf_counter()
                forward_s = ended - began
                self.busy_s += forward_s
                if first_tokens is not None:
                    _keep_books(self.trace.shared_pass, began, forward_s, len(members), so_far.tokens, mandatory,
                                budget, plain_s, first_tokens)
                _keep_books(self.costs.observe, so_far.tokens, forward_s, len(members))
                _keep_books(self._time_pieces, members, forward_s)
                made_by: list[tuple[_Item, float]] = []
                for (item, planned), result in zip(members, results):
                    value, error = _attempt(planned.finish, result, forward_s)
                    made = planned.made[-1] if planned.made else planned.expected
                    made_by.append((item, made))
                    came = self._came.get(item.session) if item.rest is not None else self._came.pop(item.session, None)
                    if self.fair:
                        _keep_books(self.plain_load.member, item.session, starting_of[id(item)], made, began, ended,
                                    came)
                    self._hand_back(item, value, error, started)
                if ratio is not None:  # each ledger: what it made against what the plain pass would have, the
                    # pass's cost less what its kept guesses free later
                    freed_s = sum(max(0.0, made - 1.0) * credit_of.get(id(item), 0.0) for item, made in made_by)
                    counted = max(floor, ratio - freed_s / plain_s)
                    for item, made in made_by:
                        _keep_books(self.ledger.after_pass, item.session, made, counted)
                made_by.clear()
        members.clear()
        del items, members, item, planned, error, results, result, value, forward_s, ratio, costs, starting_of
        del credit_of, first_tokens

    def _request_due(self, items: list[_Item], plain_s: float) -> bool:
        """Whether a session between replies is expected to ask while a pass formed now runs (about `plain_s`):
        under a program that asks the moment a reply ends, the next request lands a round trip into the pass
        after that reply's last, and waits out the rest of it."""
        with self._ready:
            busy = set(self._waiting)
        busy.update(item.session for item in items)
        now = time.perf_counter()
        return self.plain_load.due(busy, now, now + plain_s)

    def _first_tokens(self, items: list[_Item], sizes: list[int], starts: list[bool],
                      members: list[tuple[_Item, Planned]]) -> list[tuple[Hashable, int, float]]:
        """For the trace: (session, prompt tokens, when its request came) of each member whose reply's first token
        this pass makes (its prompt whole, or its last piece)."""
        planned = {id(item) for item, _ in members}
        return [(item.session, size, self._came.get(item.session, item.arrived))
                for item, size, starting in zip(items, sizes, starts)
                if starting and item.rest is None and id(item) in planned]

    def _plain_s(self, items: list[_Item], mandatory: int, costs: PassCosts) -> tuple[float | None, float]:
        """The plain pass: the members' own tokens, and each further stream server-only would run under these
        users (remote_verify/plain_load.py), priced as a member of this pass costs; and that price (`_stream_s`)."""
        members = len(items)
        members_s = costs.seconds(mandatory)
        stream_s = self._stream_s(mandatory, members_s)

        def plain_pass_s(streams: int) -> float | None:
            extra = max(0, streams - members)
            by_tokens = costs.seconds(mandatory + extra)
            if members_s is None or by_tokens is None:
                return by_tokens
            return max(by_tokens, members_s + extra * stream_s)

        if self._streams_counted_at is None or self.passes - self._streams_counted_at >= PLAIN_LOAD_PASSES:
            self.plain_streams = self.plain_load.streams({item.session for item in items}, plain_pass_s,
                                                         time.perf_counter())
            self._streams_counted_at = self.passes
        return plain_pass_s(round(max(self.plain_streams, members))), stream_s

    def _stream_s(self, mandatory: int, members_s: float | None) -> float:
        """What one more plain stream adds to a pass: what this pass's members' tokens cost beyond a pass of one
        token (c(1), a lone stream's), a token's share of it. Priced along the curve by its token alone (as it
        was), a stream left out its own sequence's work (sampling, attention over its cache): by the emulated 70B's
        profile, 0.09 ms where a stream of a few hundred tokens' cache costs 0.18, so that the plain pass was
        priced about half as far above the members' own as it is. Over the members' tokens, not their
        number: a prompt's tokens cost less than a stream's each, so a pass that reads one prices a stream
        lower (towards the plain streams, as every estimate here errs)."""
        alone_s = self.costs.seconds(1)
        if members_s is None or alone_s is None or mandatory <= 1:
            return 0.0
        # never more than the members' whole pass a token: a c(1) timed on a quieter device than the members'
        # pass (a CPU's calibration, its neighbours busy since) would price every stream dearer than any is
        return max(0.0, min((members_s - alone_s) / (mandatory - 1), members_s / mandatory))

    def _time_pieces(self, members: list[tuple[_Item, Planned]], forward_s: float) -> None:
        """Keep what a pass of rounds takes, and what each prefill piece in this pass took."""
        pieces = [(item, planned) for item, planned in members if item.rest is not None]
        for item, planned in pieces:
            item.piece_tokens, item.piece_s = len(planned.share.tokens), forward_s
            item.piece_shared = len(members) > 1
        if not pieces:
            self._round_s = forward_s if self._round_s is None else \
                ROUND_MEMORY * self._round_s + (1 - ROUND_MEMORY) * forward_s

    def _run_one_by_one(self, members: list[tuple[_Item, Planned]], started: float) -> None:
        item = planned = error = results = value = forward_s = None
        for _, planned in members:
            _, error = _attempt(planned.undo)
            if error is not None:  # the retry below reports what is wrong with this member
                log.debug("undo failed: %s", error)
        for item, planned in members:
            self.passes += 1
            self._came.pop(item.session, None)
            began = time.perf_counter()
            results, error = _attempt(run_passes, item.work.backend, [planned.share])
            value = None
            if error is None:
                forward_s = time.perf_counter() - began
                self.busy_s += forward_s
                _keep_books(self.costs.observe, len(planned.share.tokens), forward_s)
                value, error = _attempt(planned.finish, results[0], forward_s)
            self._hand_back(item, value, error, started)
        del members, item, planned, error, results, value, forward_s

    def _hand_back(self, item: _Item, result: Any, error: BaseException | None, started: float) -> None:
        if item.rest is not None and error is None and not item.gone():  # a prefill piece ran: the rest
            # waits for the session's next turn (a cancelled one's rest is dropped: its client is gone)
            item.ran_s += time.perf_counter() - started
            self._put_back(item)
            return
        item.rest = None
        item.answered = True
        if item.follow is not None and error is None:
            following, error = _attempt(item.follow, result)
            if error is None and following is not None:
                try:  # the stream's next pass waits before the next pass is formed
                    self._put(_Item(following, None, item.loop, session=item.session, follow=item.follow,
                                    deliver=item.deliver))
                except QueueClosed as closed:
                    error = closed
        queued_s = max(0.0, started - item.arrived - item.ran_s)
        try:
            if item.deliver is not None:
                item.loop.call_soon_threadsafe(item.deliver, result, error, queued_s)
            else:
                item.loop.call_soon_threadsafe(_settle, item.future, result, error, queued_s)
        except RuntimeError:  # the event loop has already closed: nobody is waiting
            log.debug("dropped a result for a closed event loop")


def _guess_share(fits: float, planned_tokens: int, sizes_left: list[int]) -> float:
    """The guesses the next member planned may add to a pass that may feed `fits` tokens: an even share of
    what is left beside the tokens planned so far and every member yet to plan's own, so that what an
    earlier member left (a stream whose guesses died, waiting for the client's next) goes to those after it."""
    if not sizes_left:
        return 0.0
    return max(0.0, (fits - planned_tokens - sum(sizes_left)) / len(sizes_left))


def _tokens_within(costs: PassCosts, bound_s: float, mandatory: int, budget: float, members: int) -> float:
    """The most tokens a pass of `members` that must feed `mandatory` may feed and cost at most `bound_s` by
    `costs` (unpriced: the budget), for `_guess_share`. Held to a first token's room, a pass whose members
    planned first each took a long chain of ever less likely guesses, up to its share of the budget, had
    room for none of the members after it, whose first guesses are the likeliest of all."""
    high = int(min(budget, mandatory + MAX_TREE_NODES * members))
    if costs.seconds(mandatory) is None or high <= mandatory:
        return budget
    return _largest_within(lambda tokens: costs.seconds(tokens) <= bound_s, mandatory, high)


def _largest_within(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n from `low` to `high` that `fits` (a bound on a cost curve, which never falls), or `low`."""
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _shares_with(head: Any, work: Shareable) -> bool:
    """Whether a waiting session's next item may join `work`'s pass (a Shareable on the same backend)."""
    return isinstance(head, Shareable) and head.backend is work.backend


def _starting(work: Shareable) -> bool:
    """Whether a member's work starts a reply (its pass must cost what the plain pass does)."""
    try:
        return work.starting is not None and bool(work.starting())
    except Exception:  # a request its plan will refuse
        return False


def _attempt(work: Callable, *args) -> tuple[Any, BaseException | None]:
    """(work(*args), None), or (None, the exception it raised).

    Caught here, in a frame of its own that holds no queue item: the exception's traceback
    starts at this frame, so it cannot lead back to the item's future (which will hold the
    exception), a cycle that would keep the request alive until a full garbage collection."""
    try:
        return work(*args), None
    except BaseException as exc:  # handed to the awaiting coroutine, raised there
        return None, exc


def _keep_books(book: Callable, *args) -> None:
    """Record what a pass measured (its cost, its members' ledgers); a fault there is logged, and the
    pass's results still go back to their sessions."""
    try:
        book(*args)
    except Exception:
        log.exception("the device queue could not record a pass (%s): its results go back all the same",
                      getattr(book, "__qualname__", book))


def _settle(future: asyncio.Future, result: Any, error: BaseException | None, queued_s: float) -> None:
    if future.cancelled():  # the connection went away while its item ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result((result, queued_s))
