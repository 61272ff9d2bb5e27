"""Fair shared passes: no member pays for another's guesses, and a first token never waits for them.

Two real sessions on the tiny llama.cpp target share a pass through the real queue: one
streaming with a long chain of likely guesses, the other a plain stream (no guesses) or a
reply's first token. The queue's cost curve is set to a compute-bound device's (each token
costs: c(n) = 2 + n ms), where guesses make a pass slower for every member in it. Each case is
also run with fairness off (the pass's goodput alone), the bug the ledger fixes: there the
guesses are taken and the check fails."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from remote_verify.pass_costs import PassCosts
from remote_verify.pass_ledger import FIRST_TOKEN_ROOM, PREFILL_ROOM, SLACK_TOKENS, PassLedger
from remote_verify.plain_load import PlainLoad
from remote_verify.scheduler import UNCUT_TOKENS, DeviceQueue
from remote_verify.session import Session, SessionLimits
from remote_verify.stream_drafts import StreamDrafts
from wire.protocol import Draft, Generate, SamplingParams


class Recorded:
    """The real target, recording the tokens each shared pass fed (every other call passes through)."""

    def __init__(self, target):
        self.target = target
        self.passes: list[int] = []
        self.members: list[list[tuple[int, int]]] = []  # each pass's (cache's id, tokens fed) of each member

    def forward_many(self, passes):
        self.passes.append(sum(len(p.tokens) for p in passes))
        self.members.append([(id(p.cache), len(p.tokens)) for p in passes])
        return self.target.forward_many(passes)

    def __getattr__(self, name):
        return getattr(self.target, name)


def compute_bound() -> PassCosts:
    costs = PassCosts()
    for n in (1, 2, 4, 8, 16, 32):
        costs.observe(n, (2 + n) / 1000)
    return costs


def guessing_stream(backend, costs: PassCosts) -> tuple[Session, object]:
    """A stream one token in, with 12 guesses of a chain right 99% of the time so far."""
    session = Session(backend, SamplingParams(), seed=1, limits=SessionLimits())
    session.start_generation(Generate(seq=1, committed_len=0, append=[1, 2, 3]))
    session.generate_step()
    drafts = StreamDrafts(seq=1)
    drafts._accepted, drafts._tested = 99.0, 100.0
    drafts.receive(Draft(seq=1, chain=1, start=len(session.committed), tokens=list(range(5, 17))))
    return session, session.stream_work(drafts, room=100, costs=costs)  # priced by the queue's curve


def one_shared_pass(backend, fair: bool, other: str, behind: bool, costs: PassCosts | None = None,
                    banked: int = 0, behind_passes: int = 3, readers: int = 0,
                    long_prompt: bool = False, first_token_room: float | None = None,
                    guesser_reads: bool = False, request_due: bool = False,
                    first_token_room_ms: float | None = None) -> tuple[int, int]:
    """(tokens the shared pass fed, the tokens its members had to feed) for the guessing stream and
    `other` ("plain": a stream one token in, no guesses; "first": a reply's prompt and first token),
    on the queue's cost curve `costs` (a compute-bound device's by default); `banked`: passes in which the
    plain stream made five tokens where the plain pass would have made one, before it fell behind;
    `readers`: other users of the service, reading a second after replies of 96 tokens that took 0.1 s here
    (guesses kept), none in this pass; `long_prompt`: a third session's prompt, too long to go whole beside
    the streams, waits to be read in pieces (the pass measured is then the first, before its pieces);
    `first_token_room`, `first_token_room_ms`: the service's --first-token-room and --first-token-room-ms (None:
    its defaults); `guesser_reads`: the guesser's
    own two replies before, of 96 tokens in 0.1 s each, a second apart (a user who leaves between replies);
    `request_due`: a session between replies is expected to ask while the pass runs (the habits' clock stands
    in: which pass a request lands in is the unit tests' of remote_verify/plain_load.py)."""
    costs = costs if costs is not None else compute_bound()
    queue = DeviceQueue("fair-test", costs=costs)
    queue.fair = fair
    if first_token_room is not None:
        queue.ledger.first_token_room = first_token_room
    if first_token_room_ms is not None:
        queue.ledger.first_token_room_s = first_token_room_ms / 1000
    if request_due:
        queue.plain_load.due = lambda busy, start, end: "guesser" in busy and "plain" in busy
    guesser, guessing = guessing_stream(backend, costs)
    plain = Session(backend, SamplingParams(), seed=2, limits=SessionLimits())
    plain.start_generation(Generate(seq=1, committed_len=0, append=[4, 5, 6, 7]))
    if other == "plain":
        plain.generate_step()
    work = plain.stream_work()
    mandatory = guessing.tokens() + work.tokens()
    for _ in range(banked):  # a reply that drafted well, some time before
        queue.ledger.after_pass("plain", 5.0, 1.2)
    if behind:  # the plain stream already paid for guesses in earlier passes: its ledger is spent
        for _ in range(behind_passes):
            queue.ledger.after_pass("plain", 1.0, 1.0 + SLACK_TOKENS)
    now = time.perf_counter()
    for reader in range(readers):  # two replies each, the last ended half a second ago
        for began in (now - 1.7, now - 0.6):
            queue.plain_load.member(("reader", reader), True, 1.0, began, began + 0.01)
            queue.plain_load.member(("reader", reader), False, 95.0, began + 0.01, began + 0.1)
    if guesser_reads:
        for began in (now - 2.3, now - 1.2):
            queue.plain_load.member("guesser", True, 1.0, began, began + 0.01)
            queue.plain_load.member("guesser", False, 95.0, began + 0.01, began + 0.1)
    prompted = None  # the session whose long prompt waits (`long_prompt`)
    if long_prompt:
        prompted = Session(backend, SamplingParams(), seed=3, limits=SessionLimits())
        prompted.start_generation(Generate(seq=1, committed_len=0, append=list(range(10, 10 + 3 * UNCUT_TOKENS))))
    gate = threading.Event()

    async def main():
        held = asyncio.ensure_future(queue.run("holder", lambda: gate.wait(5)))
        await asyncio.sleep(0.05)
        jobs = [asyncio.ensure_future(queue.run("guesser", guessing)),
                asyncio.ensure_future(queue.run("plain", work))]
        if prompted is not None:
            jobs.append(asyncio.ensure_future(queue.run("prompted", prompted.stream_work())))
        await asyncio.sleep(0.05)
        gate.set()
        await held
        await asyncio.gather(*jobs)

    before = len(backend.passes)  # the sessions' own first steps, above
    try:
        asyncio.run(main())
    finally:
        queue.shutdown()
        guesser.close()
        plain.close()
        if prompted is not None:
            prompted.close()
    return backend.passes[before if long_prompt else -1], mandatory


def member_work_curve() -> PassCosts:
    """A GPU-like device where each member's own sequence costs as much as its token: a lone token's pass
    20 ms, two members' 40 ms, each further token 10 ms."""
    costs = PassCosts()
    costs.observe(1, 0.020, members=1)
    for n in (2, 4, 8, 16, 32):
        costs.observe(n, (20 + 10 * n) / 1000, members=2)
    return costs


@pytest.fixture()
def backend(own_llamacpp_target):
    return Recorded(own_llamacpp_target)


def test_guesses_take_only_what_the_other_members_ledgers_allow(backend):
    """A member that has already run its deficit (its ledger at -SLACK) lets no guess slow its pass:
    the pass feeds what the members must. Fairness off, the same pass takes the guesses."""
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=True)
    assert fed == mandatory
    fed_unfair, mandatory = one_shared_pass(backend, fair=False, other="plain", behind=True)
    assert fed_unfair > mandatory  # planted: the goodput objective alone makes the plain stream pay


def test_gains_banked_in_an_earlier_reply_do_not_hide_a_member_falling_behind_now(backend):
    """Two hundred passes ahead (a reply that drafted well), then ten passes behind (the next reply's
    text drafts badly, and others' guesses made its passes twice as long): it is behind now, and lets no
    guess slow its pass. Kept whole (planted: no cap on what is banked), those gains would stand at about
    a hundred and ninety and lend every pass its full room for a hundred passes more."""
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=True, banked=200, behind_passes=10)
    assert fed == mandatory


def test_a_fresh_member_lets_guesses_cost_its_slack_at_most(backend):
    """A plain stream with an even ledger lets the pass cost at most 1 + SLACK times the plain pass."""
    costs = compute_bound()
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=False)
    assert fed > mandatory  # guesses do fill the room there is
    assert costs.seconds(fed) <= (1 + SLACK_TOKENS) * costs.seconds(mandatory) + 1e-9


def test_a_member_whose_every_pass_others_fill_to_its_room_stays_within_three_percent_of_a_plain_stream():
    """A plain stream (one token a pass) shares every pass with guessers that fill it to the stream's room:
    each pass costs 1 + its room times the plain pass. Over a thousand passes it makes at least 0.965 of
    the tokens a plain stream makes in the same time: the issue's 0.95x with a margin for what the ledger
    does not see (its prices are estimates; a faster service is asked more prompts under a closed loop).
    With the allowance at 0.03 (the bound at the issue's 0.95x itself: planted, as it was) it reads 0.952."""
    ledger = PassLedger()
    made = spent = 0.0
    for _ in range(1000):
        ratio = 1.0 + max(0.0, ledger.room("plain", starting=False))
        ledger.after_pass("plain", 1.0, ratio)
        made, spent = made + 1.0, spent + ratio
    assert made / spent >= 0.965


def test_a_first_token_never_waits_for_other_members_guesses(backend):
    """A reply's prompt and first token share a pass with a guessing stream: the pass costs at most
    1 + FIRST_TOKEN_ROOM times the plain pass (the guesses that fit are taken). Fairness off, the
    guesses are taken by the pass's goodput alone and the first token waits for them."""
    costs = compute_bound()
    fed, mandatory = one_shared_pass(backend, fair=True, other="first", behind=False)
    assert mandatory < fed and costs.seconds(fed) <= (1 + FIRST_TOKEN_ROOM) * costs.seconds(mandatory) + 1e-9
    fed_unfair, mandatory = one_shared_pass(backend, fair=False, other="first", behind=False)
    assert costs.seconds(fed_unfair) > (1 + FIRST_TOKEN_ROOM) * costs.seconds(mandatory)


def test_a_first_token_room_of_nothing_keeps_every_guess_out_of_its_pass(backend):
    """`specwire serve --first-token-room 0`: the pass that makes a reply's first token feeds what its
    members must, no guess (at the default room the same pass takes some: the test above)."""
    fed, mandatory = one_shared_pass(backend, fair=True, other="first", behind=False, first_token_room=0.0)
    assert fed == mandatory


def test_a_first_tokens_room_is_a_time_as_well_as_a_share_of_the_plain_pass(backend):
    """`--first-token-room-ms 2` beside the default room of 1: the pass that makes a reply's first token (a plain
    pass of about 7 ms on this curve) costs at most 2 ms more than the plain pass, not 7, and still takes the
    guesses that fit in them; without the bound in time (inf), the same pass takes guesses past 2 ms."""
    costs = compute_bound()
    fed, mandatory = one_shared_pass(backend, fair=True, other="first", behind=False, first_token_room_ms=2.0)
    assert mandatory < fed and costs.seconds(fed) <= costs.seconds(mandatory) + 0.002 + 1e-9, (fed, mandatory)
    fed_share, mandatory = one_shared_pass(backend, fair=True, other="first", behind=False,
                                           first_token_room_ms=float("inf"))
    assert costs.seconds(fed_share) > costs.seconds(mandatory) + 0.002, (fed_share, mandatory)


def test_a_prompt_read_in_pieces_is_not_queued_behind_other_members_guesses(backend):
    """A long prompt waits to be read in pieces (every pass until its first token delays it, those
    between its pieces too) while a guessing stream and a plain stream share a pass: the pass costs at most
    1 + PREFILL_ROOM times the plain pass, where the plain stream's even ledger alone lets it cost 1 + SLACK
    (planted: the rule off, the first pass takes those guesses and the check fails)."""
    costs = compute_bound()
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=False, long_prompt=True)
    assert costs.seconds(fed) <= (1 + PREFILL_ROOM) * costs.seconds(mandatory) + 1e-9
    fed_alone, _ = one_shared_pass(backend, fair=True, other="plain", behind=False)
    assert costs.seconds(fed_alone) > (1 + PREFILL_ROOM) * costs.seconds(mandatory)  # no prompt waits: the room is used


def test_a_pass_is_priced_by_passes_of_about_as_many_members(backend, monkeypatch):
    """The passes of one member timed compute-bound (each token costs), many times; the passes of two
    timed flat, once: a pass of two members is priced by the passes of two and takes every guess.
    Priced by the curve of every pass instead (planted: mostly the one-member passes), it takes only
    what a compute-bound device affords."""
    costs = PassCosts()
    for n in (2, 4, 8, 16, 32):
        costs.observe(n, 0.003, members=2)
    for _ in range(10):
        for n in (2, 4, 8, 16, 32):
            costs.observe(n, (2 + n) / 1000, members=1)
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=False, costs=costs)
    assert fed == mandatory + 12  # every guess of the chain
    monkeypatch.setattr(PassCosts, "shared", lambda self, members: self)
    fed_planted, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=False, costs=costs)
    assert fed_planted < mandatory + 12


def test_guesses_may_cost_what_server_only_passes_would_under_users_who_read(backend):
    """Eighty other users read between replies, none in this pass: server-only, its replies longer, would
    run many of their streams too, so a plain stream's pass there costs c(the members' tokens + dozens)
    (remote_verify/plain_load.py), and a fresh member lets guesses cost its slack over that: here, the
    whole chain, a pass more than 1 + SLACK times the members' own plain pass. Priced by this pass's members
    alone (planted: no readers; the test above), the same member lets only part of the chain in."""
    costs = compute_bound()
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=False, readers=80)
    assert fed == mandatory + 12  # every guess of the chain
    assert costs.seconds(fed) > (1 + SLACK_TOKENS) * costs.seconds(mandatory)
    assert costs.seconds(fed) <= (1 + SLACK_TOKENS) * costs.seconds(mandatory + 80) + 1e-9
    fed_alone, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=False)
    assert fed_alone < mandatory + 12


def test_a_stream_server_only_would_add_is_priced_as_a_member_costs_not_as_a_token(backend, monkeypatch):
    """A GPU-like device where each member's own sequence costs as much as its token (a lone token's pass
    20 ms, two members' 40 ms, each further token 10 ms), four users who read between replies, none in
    this pass, and a plain member just behind its plain stream: the plain pass holds the streams server-only
    would add, each priced as this pass's members cost (20 ms), and the guesser's chain may take what that
    allows. Priced by its token alone (planted: the stream's price 0, as it was), the plain pass is 10 ms a
    stream cheaper and the chain gets fewer guesses."""

    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=True, behind_passes=1,
                                     costs=member_work_curve(), readers=4)
    monkeypatch.setattr(DeviceQueue, "_stream_s", lambda self, mandatory, members_s: 0.0)
    fed_planted, _ = one_shared_pass(backend, fair=True, other="plain", behind=True, behind_passes=1,
                                     costs=member_work_curve(), readers=4)
    assert mandatory < fed_planted < fed <= mandatory + 12, (fed_planted, fed, mandatory)


def test_a_kept_guess_is_credited_with_the_place_it_frees_in_a_later_pass(backend, monkeypatch):
    """The guesser reads a second after each reply (0.1 s here): each guess it keeps ends its reply a pass
    sooner, and it leaves the passes that much sooner, its gap's share of its cycle (0.91) of a stream's
    place freed for the others (remote_verify/plain_load.py `freed`): 18 ms on this GPU-like curve, more
    than the 10 ms a guess costs. So the plain member just behind its plain stream lets the whole chain in;
    with nothing credited (planted: `freed` 0, the ledger as it was) it lets in fewer."""
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=True, behind_passes=1,
                                     costs=member_work_curve(), guesser_reads=True)
    monkeypatch.setattr(PlainLoad, "freed", lambda self, session: 0.0)
    fed_planted, _ = one_shared_pass(backend, fair=True, other="plain", behind=True, behind_passes=1,
                                     costs=member_work_curve(), guesser_reads=True)
    assert fed == mandatory + 12 and fed_planted < fed, (fed_planted, fed, mandatory)


def test_a_pass_a_new_replys_request_is_due_to_land_in_is_held_to_a_first_tokens_room(backend):
    """A program that asks the moment a reply ends lands its request a round trip into the pass after that
    reply's last, and waits out the rest of it: under `--first-token-room 0.2` that pass costs at most 1.2
    times the plain pass, where the plain stream's even ledger alone lets it cost 1 + SLACK (planted: the
    rule off, the same pass takes those guesses, as the second pass below does with no request due)."""
    costs, room = compute_bound(), 0.2
    fed, mandatory = one_shared_pass(backend, fair=True, other="plain", behind=False, request_due=True,
                                     first_token_room=room)
    assert costs.seconds(fed) <= (1 + room) * costs.seconds(mandatory) + 1e-9
    fed_alone, _ = one_shared_pass(backend, fair=True, other="plain", behind=False, first_token_room=room)
    assert costs.seconds(fed_alone) > (1 + room) * costs.seconds(mandatory)


def shared_pass_of(backend, kinds: list[str], curve, batch_tokens: int | None = None) -> dict[str, int]:
    """The tokens each member fed in one shared pass through the real queue, by name: `kinds` names the
    members in the order they come ("guess..." a stream with a chain of 12 likely guesses, "plain..." a stream
    with none, "first..." a reply's prompt and first token), each with an even ledger; `curve()` makes the
    queue's cost curve (which the pass's own timing then joins); `batch_tokens`: the pass's budget, where
    not the service's."""
    costs = curve()
    queue = DeviceQueue("share-test", costs=costs) if batch_tokens is None else \
        DeviceQueue("share-test", costs=costs, batch_tokens=batch_tokens, member_tokens=1)
    queue.fair = True  # as the service runs it
    sessions, works = {}, {}
    for seed, name in enumerate(kinds):
        if name.startswith("guess"):
            sessions[name], works[name] = guessing_stream(backend, costs)
            continue
        session = Session(backend, SamplingParams(), seed=seed + 2, limits=SessionLimits())
        session.start_generation(Generate(seq=1, committed_len=0, append=[4, 5, 6, 7]))
        if name.startswith("plain"):
            session.generate_step()
        sessions[name], works[name] = session, session.stream_work()
    gate = threading.Event()

    async def main():
        held = asyncio.ensure_future(queue.run("holder", lambda: gate.wait(5)))
        await asyncio.sleep(0.05)
        jobs = [asyncio.ensure_future(queue.run(name, works[name])) for name in kinds]
        await asyncio.sleep(0.05)
        gate.set()
        await held
        await asyncio.gather(*jobs)

    before = len(backend.members)
    by_cache = {id(session.cache): name for name, session in sessions.items()}
    try:
        asyncio.run(main())
    finally:
        queue.shutdown()
        for session in sessions.values():
            session.close()
    assert len(backend.members) == before + 1, "the members ran in one pass"
    return {by_cache[cache]: fed for cache, fed in backend.members[-1]}


def test_a_first_tokens_room_is_shared_out_among_the_members_guesses(backend):
    """Four streams with long chains of likely guesses share a pass with a reply's first token, on a
    compute-bound curve where the first token's room (twice the plain pass) has place for ten guesses:
    each stream gets its share of them, its likeliest, and the pass stays within the room. Shared out as
    the budget alone is (planted: a member's share only of the budget's 256), the stream planned first took
    all ten and the others none; planned after them (planted: members by their ledgers alone, a new reply's
    pass not first), the reply's first pass, which has no guess to send, kept a share of the room unused."""
    costs = compute_bound()
    fed = shared_pass_of(backend, ["guess1", "guess2", "guess3", "guess4", "first"], compute_bound)
    mandatory = 4 + 4  # a token each stream, the prompt's four
    assert costs.seconds(sum(fed.values())) <= (1 + FIRST_TOKEN_ROOM) * costs.seconds(mandatory) + 1e-9, fed
    guesses = [fed[f"guess{n}"] - 1 for n in range(1, 5)]
    assert sum(guesses) == 10 and min(guesses) >= 2, fed



def flat() -> PassCosts:
    """A device whose pass costs about the same for 1 or 32 tokens (a GPU's, below its compute bound)."""
    costs = PassCosts()
    for n in (1, 2, 4, 8, 16, 32):
        costs.observe(n, (10 + n / 100) / 1000)
    return costs


def test_a_budget_share_a_member_leaves_goes_to_the_members_planned_after_it(backend):
    """Three streams with no guess to send (their chains died at a miss: they wait a round trip for the
    client's next) share a pass with one whose chain holds 12 likely guesses, on a flat curve, in a budget of
    16 tokens: what the three leave of their shares goes to the fourth, which sends all 12. With each share
    fixed at the pass's start (planted: a quarter of the 12 the budget leaves beside the members' own
    tokens), it sent 3, and the pass fed 7 tokens of the 16 it could have."""
    fed = shared_pass_of(backend, ["plain1", "plain2", "plain3", "guess1"], flat, batch_tokens=16)
    assert [fed[f"plain{n}"] for n in (1, 2, 3)] == [1, 1, 1], fed
    assert fed["guess1"] == 1 + 12, fed
