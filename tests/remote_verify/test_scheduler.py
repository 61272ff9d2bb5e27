"""The device queue: one worker thread, sessions served in turn, errors handed back."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from functools import partial

import pytest

from remote_verify.backends.target import Pass
from remote_verify.scheduler import DeviceQueue, Planned, QueueClosed, Shareable


def test_a_busy_session_does_not_starve_the_others():
    """A session with 20 items queued and two sessions with one each: the two run after at most
    one more of the busy session's items, not after all twenty."""
    queue = DeviceQueue("test")
    order: list[str] = []
    gate = threading.Event()

    def work(name: str):
        gate.wait(5)  # hold the worker until everything is queued
        order.append(name)

    async def main():
        busy = [asyncio.ensure_future(queue.run("busy", lambda i=i: work(f"busy{i}"))) for i in range(20)]
        await asyncio.sleep(0.05)
        others = [asyncio.ensure_future(queue.run(name, lambda n=name: work(n))) for name in ("a", "b")]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*busy, *others)

    asyncio.run(main())
    queue.shutdown()
    assert len(order) == 22
    assert order.index("a") <= 2 and order.index("b") <= 3, order
    assert [n for n in order if n.startswith("busy")] == [f"busy{i}" for i in range(20)]  # FIFO within a session


def test_results_errors_and_queue_time_come_back_to_the_caller():
    """run() returns the work's result with the time it waited; an exception is raised in the caller."""
    queue = DeviceQueue("test")

    async def main():
        arrived = time.perf_counter() - 0.2  # the request reached the service 200 ms ago
        result, queued = await queue.run("s", lambda: 42, arrived=arrived)
        assert result == 42 and queued >= 0.2
        with pytest.raises(ZeroDivisionError):
            await queue.run("s", lambda: 1 / 0)
        worker_threads = set()
        for _ in range(3):
            await queue.run("s", lambda: worker_threads.add(threading.get_ident()))
        assert len(worker_threads) == 1 and threading.get_ident() not in worker_threads

    asyncio.run(main())
    queue.shutdown()

    async def after_shutdown():
        with pytest.raises(QueueClosed):
            await queue.run("s", lambda: None)

    asyncio.run(after_shutdown())


class _Request:
    """Stands for a decoded request (a weak reference tells when it is freed)."""


def test_a_refused_request_is_freed_without_waiting_for_the_garbage_collector():
    """Work that raises on the device thread: once the caller has handled the exception, the
    request, the exception and the future are freed by reference counting alone (no cycle
    through the traceback's frames), with the garbage collector off."""
    queue = DeviceQueue("test")
    freed: list[weakref.ref] = []

    class Refused(Exception):
        pass

    def refuse(request: _Request):
        raise Refused("no")

    async def main():
        for _ in range(3):
            request = _Request()
            freed.append(weakref.ref(request))
            try:
                await queue.run("s", partial(refuse, request))
            except Refused:
                pass
            del request
        await asyncio.sleep(0.05)  # the worker has gone back to waiting for work

    gc.collect()
    gc.disable()
    try:
        asyncio.run(main())
        alive = sum(ref() is not None for ref in freed)
    finally:
        gc.enable()
        queue.shutdown()
    assert alive == 0, f"{alive} of 3 refused requests still alive"


# ---- shared passes ----------------------------------------------------------------------


class RecordingTarget:
    """The real tiny llama.cpp target, recording which sessions each forward_many served."""

    def __init__(self, target):
        self.target = target
        self.passes: list[list[tuple[str, int]]] = []  # per pass: (session, tokens fed)
        self.names: dict[int, str] = {}

    def forward_many(self, passes):
        self.passes.append([(self.names[id(p.cache)], len(p.tokens)) for p in passes])
        return self.target.forward_many(passes)


def shareable(recorder: RecordingTarget, cache, name: str, tokens: list[int], fail: str = "",
              starting: bool = False) -> Shareable:
    """A one-row pass over `tokens` whose result is (name, argmax id); `fail` refuses it at planning;
    `starting`: it feeds a new reply's prompt (its pass makes the reply's first token)."""
    recorder.names[id(cache)] = name

    def plan(so_far=None) -> Planned:
        if fail:
            raise ValueError(fail)
        held = cache.length
        return Planned(Pass(cache, tokens, 1, argmax_only=True), lambda ids, _: (name, int(ids[0])),
                       lambda: recorder.target.truncate(cache, held))

    return Shareable(recorder, plan, lambda: len(tokens), starting=(lambda: True) if starting else None)


def run_held(queue: DeviceQueue, jobs: list[tuple[str, object]]) -> list:
    """Queue every (session, work) while the worker is held by another item, then let it go."""
    gate = threading.Event()

    async def main():
        held = asyncio.ensure_future(queue.run("holder", lambda: gate.wait(5)))
        await asyncio.sleep(0.05)
        futures = [asyncio.ensure_future(queue.run(session, work)) for session, work in jobs]
        await asyncio.sleep(0.05)
        gate.set()
        await held
        return await asyncio.gather(*futures, return_exceptions=True)

    try:
        return asyncio.run(main())
    finally:
        queue.shutdown()


@pytest.fixture()
def recorder(llamacpp_target):
    recorder = RecordingTarget(llamacpp_target)
    caches = {name: llamacpp_target.new_cache() for name in "abcdef"}
    recorder.caches = caches
    yield recorder
    for cache in caches.values():
        llamacpp_target.release(cache)


def test_waiting_sessions_share_a_pass_one_round_each_in_turn(recorder):
    """Three sessions with two rounds waiting and one with one: the first pass serves each
    session once, in turn order; the second the three that had more; every result is its
    own session's, the same as the same round run alone."""
    c = recorder.caches
    jobs = [(name, shareable(recorder, c[name], name, [10 + i, 20 + i, 30 + i]))
            for i, name in enumerate("abc")]
    jobs += [(name, shareable(recorder, c[name], name, [40 + i])) for i, name in enumerate("abc")]
    jobs.append(("d", shareable(recorder, c["d"], "d", [50, 51, 52])))
    results = run_held(DeviceQueue("test"), jobs)
    assert [[name for name, _ in members] for members in recorder.passes] == [list("abcd"), list("abc")]
    assert [result[0][0] for result in results] == list("abcabcd")

    alone, seen = [], set()
    for name, work in jobs:  # the same rounds, one pass each, from the same empty caches
        if name not in seen:
            recorder.target.truncate(c[name], 0)
            seen.add(name)
        alone.append(run_held(DeviceQueue("solo", batch_tokens=0), [(name, work)])[0])
    assert [result[0] for result in results] == [result[0] for result in alone]
    assert len(recorder.passes) == 2 + len(jobs)  # batch_tokens=0: one session a pass


def test_a_pass_keeps_to_its_token_budget(recorder):
    """batch_tokens=8: the session in turn always runs (even with 12 tokens, alone); another
    joins only if its block fits what is left, and one that does not keeps its place."""
    c = recorder.caches
    jobs = [("a", shareable(recorder, c["a"], "a", list(range(1, 13)))),  # over the budget alone
            ("b", shareable(recorder, c["b"], "b", [5, 6, 7, 8, 9])),
            ("c", shareable(recorder, c["c"], "c", [5, 6, 7, 8, 9])),
            ("d", shareable(recorder, c["d"], "d", [3, 4, 5]))]
    run_held(DeviceQueue("test", batch_tokens=8, member_tokens=0), jobs)
    assert recorder.passes == [[("a", 12)], [("b", 5), ("d", 3)], [("c", 5)]]


def test_a_new_prompt_is_not_held_out_of_a_pass_by_the_budget(recorder):
    """batch_tokens=8: beside a round of 5, new replies' prompts of 50 and of 90 tokens (the one within a piece,
    64 on a backend that measures no prices, the other within the piece and a half a prompt goes whole in) join
    the pass, where another round of 5 waits for the next; a third prompt of 60 waits too, the pass's prompts held to
    two prompts that each go whole (JOIN_PIECES, 192); and a round of 3 still joins: the prompts beyond the
    budget do not take the streams' share of it. Held out, a new prompt's first token waited a whole pass more
    (the emulated 32B's closed loop: its p99's tail), and a stream shut out by prompts its token."""
    c = recorder.caches

    def prompt(n: int, first: int) -> list[int]:  # n token ids, each prompt its own
        return [1 + (first + i) % 100 for i in range(n)]

    jobs = [("a", shareable(recorder, c["a"], "a", [5, 6, 7, 8, 9])),
            ("b", shareable(recorder, c["b"], "b", [5, 6, 7, 8, 9])),
            ("c", shareable(recorder, c["c"], "c", prompt(50, 0), starting=True)),
            ("d", shareable(recorder, c["d"], "d", prompt(90, 50), starting=True)),
            ("e", shareable(recorder, c["e"], "e", prompt(60, 40), starting=True)),
            ("f", shareable(recorder, c["f"], "f", [3, 4, 5]))]
    run_held(DeviceQueue("test", batch_tokens=8, member_tokens=0), jobs)
    assert recorder.passes[0] == [("a", 5), ("c", 50), ("d", 90), ("f", 3)], recorder.passes
    assert sorted(name for members in recorder.passes[1:] for name, _ in members) == ["b", "e"], recorder.passes


def test_the_pass_trace_holds_each_pass_and_each_first_token_with_its_arrival(recorder, tmp_path):
    """With a trace (`specwire serve --trace-passes`), each shared pass is a line: its members, tokens (the
    members' own), budget, and each reply's first token it made, with its prompt and when it came, before the
    pass began; a round that starts no reply is not a first token. benchmarks/pass_trace_report.py reads it."""
    from benchmarks.pass_trace_report import first_tokens, read
    from remote_verify.pass_trace import PassTrace

    c = recorder.caches
    jobs = [("a", shareable(recorder, c["a"], "a", [5, 6, 7, 8, 9])),
            ("b", shareable(recorder, c["b"], "b", [5, 6, 7, 8, 9])),
            ("c", shareable(recorder, c["c"], "c", list(range(1, 41)), starting=True))]
    queue = DeviceQueue("test", batch_tokens=8, member_tokens=0)
    queue.trace = PassTrace(tmp_path / "passes.jsonl")
    run_held(queue, jobs)
    queue.trace.close()
    passes = read(tmp_path / "passes.jsonl")
    assert [(each.members, each.tokens, each.own, each.budget) for each in passes] == [(2, 45, 45, 8), (1, 5, 5, 8)]
    assert [[(session, prompt) for session, prompt, _ in each.first] for each in passes] == [[("c", 40)], []]
    arrived = passes[0].first[0][2]
    assert arrived < passes[0].began and passes[0].seconds > 0
    made = first_tokens(passes)
    assert len(made) == 1 and made[0].seconds == pytest.approx(passes[0].ended - arrived)


def test_a_pass_of_many_members_may_feed_its_tokens_a_member(recorder):
    """batch_tokens=8 and member_tokens=3: four sessions of three tokens share one pass of 12 (8 alone
    held two of them); two sessions of five are held to 8, one a pass, as without it."""
    c = recorder.caches
    jobs = [(name, shareable(recorder, c[name], name, [5, 6, 7])) for name in "abcd"]
    run_held(DeviceQueue("test", batch_tokens=8, member_tokens=3), jobs)
    assert recorder.passes == [[("a", 3), ("b", 3), ("c", 3), ("d", 3)]]

    recorder.passes.clear()
    jobs = [(name, shareable(recorder, c[name], name, [5, 6, 7, 8, 9])) for name in "ab"]
    run_held(DeviceQueue("test", batch_tokens=8, member_tokens=3), jobs)
    assert recorder.passes == [[("a", 5)], [("b", 5)]]


def test_a_refusal_or_a_failed_pass_stays_with_its_session(recorder, llamacpp_target):
    """One round refused at planning and one whose cache is gone (the shared pass fails): those
    two get their errors; the other two get the results they get alone."""
    c = recorder.caches
    gone = llamacpp_target.new_cache()
    llamacpp_target.release(gone)
    jobs = [("a", shareable(recorder, c["a"], "a", [10, 11])),
            ("b", shareable(recorder, c["b"], "b", [12], fail="refused")),
            ("x", shareable(recorder, gone, "x", [13, 14])),
            ("c", shareable(recorder, c["c"], "c", [15, 16]))]
    results = run_held(DeviceQueue("test"), jobs)
    assert isinstance(results[1], ValueError) and str(results[1]) == "refused"
    assert isinstance(results[2], ValueError) and "not a live slot" in str(results[2])
    assert recorder.passes[0] == [("a", 2), ("x", 2), ("c", 2)]  # the shared pass, failed
    assert recorder.passes[1:] == [[("a", 2)], [("x", 2)], [("c", 2)]]  # undone, then one by one
    for name, tokens, result in (("a", [10, 11], results[0]), ("c", [15, 16], results[3])):
        llamacpp_target.truncate(c[name], 0)
        expected = int(llamacpp_target.forward(c[name], tokens, 1)[0].argmax())
        assert result[0] == (name, expected)


def test_other_work_runs_alone_in_its_turn(recorder):
    """A session whose next item is not a round (a Sync, a cache release) is passed over by the
    shared pass and keeps its place in line: its item runs alone, after that pass."""
    c = recorder.caches
    order = []
    jobs = [("a", shareable(recorder, c["a"], "a", [1, 2])),
            ("b", lambda: order.append(len(recorder.passes))),
            ("c", shareable(recorder, c["c"], "c", [3, 4]))]
    results = run_held(DeviceQueue("test"), jobs)
    assert recorder.passes == [[("a", 2), ("c", 2)]] and order == [1]
    assert not any(isinstance(result, Exception) for result in results)


# ---- charged by tokens; long feeds in pieces (issue 29) ---------------------------------------


def test_sessions_are_charged_by_the_tokens_they_feed(recorder):
    """One session with rounds of 40 tokens and one with rounds of 2, one pass each (no sharing):
    the short session's six rounds all run before the long one's second, where turns by item
    alternated them."""
    c = recorder.caches
    jobs = [("a", shareable(recorder, c["a"], "a", list(range(1 + i, 41 + i)))) for i in range(3)]
    jobs += [("b", shareable(recorder, c["b"], "b", [7 + i, 8 + i])) for i in range(6)]
    run_held(DeviceQueue("test", batch_tokens=0), jobs)
    order = "".join(name for members in recorder.passes for name, _ in members)
    assert order == "abbbbbbaa", order


class RecordingBackend:
    """The real tiny target for whole sessions, recording the tokens each session fed in each pass."""

    def __init__(self, target):
        self.target = target
        self.passes: list[list[tuple[str, int]]] = []
        self.names: dict[int, str] = {}

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward_many(self, passes):
        self.passes.append([(self.names.get(id(p.cache), "?"), len(p.tokens)) for p in passes])
        return self.target.forward_many(passes)


def _sessions(backend: RecordingBackend, names: str):
    from remote_verify.session import Session, SessionLimits
    from wire.protocol import SamplingParams

    sessions = {}
    for name in names:
        sessions[name] = Session(backend, SamplingParams(), None, SessionLimits())
        backend.names[id(sessions[name].cache)] = name
    return sessions


def test_a_fault_in_the_queues_own_books_loses_no_result_and_stops_no_service(recorder, monkeypatch):
    """What a pass measured failing to record (its cost): its results still go back. The queue's own
    planning failing (a member's ledger): that turn's sessions get an error that says so, and the
    next turn is served. Either way the worker thread lives on (it died before: the service then took
    connections and answered none)."""

    c = recorder.caches

    def broken(*args, **kwargs):
        raise KeyError("a bug in the books")

    # each fault is planted in this test's queue alone: patched on the class, it reached the services
    # other tests on this worker share, whose queues a fault then closed
    books = DeviceQueue("books-test")
    monkeypatch.setattr(books.costs, "observe", broken)
    results = run_held(books, [(name, shareable(recorder, c[name], name, [10, 11])) for name in "ab"])
    assert [result[0][0] for result in results] == ["a", "b"]  # served, in one pass
    assert recorder.passes == [[("a", 2), ("b", 2)]]

    queue = DeviceQueue("plan-test")
    monkeypatch.setattr(queue.ledger, "room", broken)

    async def main():
        failing = [asyncio.ensure_future(queue.run(name, shareable(recorder, c[name], name, [12]))) for name in "cd"]
        failed = await asyncio.wait_for(asyncio.gather(*failing, return_exceptions=True), 30)
        monkeypatch.undo()
        after = await asyncio.wait_for(queue.run("c", shareable(recorder, c["c"], "c", [13])), 30)
        return failed, after

    try:
        failed, after = asyncio.run(main())
    finally:
        queue.shutdown()
    assert all(isinstance(result, RuntimeError) and "the service failed on this pass" in str(result)
               and "a bug in the books" in str(result) for result in failed), failed
    assert after[0][0] == "c"  # the same queue, the next turn


def test_a_fault_in_choosing_a_turn_closes_the_queue_and_answers_everyone_waiting(monkeypatch):
    """The worker failing where it chooses the next turn (the line itself is in doubt): every waiting
    session gets an error that says what failed and what to do, the queue says why it stopped
    (the service's /healthz then answers 503), and new work is refused, instead of waiting for ever."""
    queue = DeviceQueue("closing-test")
    gate = threading.Event()

    def broken(line):
        raise KeyError("a bug in the line")

    async def main():
        held = asyncio.ensure_future(queue.run("holder", lambda: gate.wait(5)))
        await asyncio.sleep(0.05)
        monkeypatch.setattr(queue, "_round_before_piece", broken)  # this queue's only (see above)
        waiting = [asyncio.ensure_future(queue.run(name, lambda: name)) for name in "ab"]
        await asyncio.sleep(0.05)
        gate.set()
        await held
        return await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 30)

    try:
        results = asyncio.run(main())
    finally:
        queue.shutdown()
    assert all(isinstance(result, QueueClosed) and "a bug in the line" in str(result) and "restart" in str(result)
               for result in results), results
    assert queue.failure is not None and "a bug in the line" in queue.failure

    async def after():
        with pytest.raises(QueueClosed):
            await queue.run("c", lambda: 1)

    asyncio.run(after())


def test_a_long_feed_runs_in_pieces_that_take_turns_and_verifies_as_one_pass(llamacpp_target):
    """A 300-token prompt queued before three short rounds of other sessions: the rounds go first
    (one shared pass: a round goes before a piece), then the prompt in pieces; its verdict is the
    one the prompt gets in a single pass (llama.cpp's kernels are batch-invariant). (By charge
    alone the prompt's first piece went first: a round waited for a piece of every prefill.)"""
    from wire.protocol import Verify

    prompt = [(7 * i) % 300 + 1 for i in range(300)]
    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "pxyz")
    try:
        jobs = [("p", sessions["p"].verify_work(Verify(seq=1, committed_len=0, append=prompt, draft=[5, 6])))]
        jobs += [(name, sessions[name].verify_work(Verify(seq=1, committed_len=0, append=[3, 4])))
                 for name in "xyz"]
        results = run_held(DeviceQueue("test"), jobs)
        fed = [(name, tokens) for members in backend.passes for name, tokens in members]
        pieces = [tokens for name, tokens in fed if name == "p"]
        assert len(pieces) > 2 and sum(pieces) == 300 + 2 and max(pieces) < 299, fed
        assert sorted(name for name, _ in backend.passes[0]) == list("xyz"), fed  # ahead of every piece
        alone = _sessions(RecordingBackend(llamacpp_target), "p")["p"]
        try:
            expected = alone.verify(Verify(seq=1, committed_len=0, append=prompt, draft=[5, 6]))
        finally:
            alone.close()
        assert (results[0][0].accepted, results[0][0].token) == (expected.accepted, expected.token)
        assert results[0][0].committed_len == expected.committed_len
        assert sessions["p"].committed == alone.committed and sessions["p"].cached_len == alone.cached_len
    finally:
        for session in sessions.values():
            session.close()


def test_a_feed_whose_charge_was_forgotten_mid_piece_goes_on(llamacpp_target):
    """A long prompt's session goes quiet to the queue while its pieces run (it waits for nothing in
    line), and the queue forgets quiet sessions' charges: its next piece, put back in line, still gets
    its turn (without a charge, the next turn's sort raised in the worker thread and every session
    waited for ever: seen at 128 emulated users)."""
    from wire.protocol import Verify

    prompt = [(7 * i) % 300 + 1 for i in range(300)]
    queue = DeviceQueue("forget-test")

    class ForgettingBackend(RecordingBackend):
        def forward_many(self, passes):
            with queue._ready:  # as `_note_seen` does for a session quiet for ACTIVE_S and not in line
                if "p" not in queue._waiting:
                    queue._charged.pop("p", None)
            return super().forward_many(passes)

    backend = ForgettingBackend(llamacpp_target)
    sessions = _sessions(backend, "pq")
    try:
        async def main():
            return await asyncio.wait_for(asyncio.gather(
                queue.run("p", sessions["p"].verify_work(Verify(seq=1, committed_len=0, append=prompt, draft=[5]))),
                queue.run("q", sessions["q"].verify_work(Verify(seq=1, committed_len=0, append=[3, 4])))), 60)

        results = asyncio.run(main())
        pieces = [tokens for members in backend.passes for name, tokens in members if name == "p"]
        assert len(pieces) > 1 and sum(pieces) == 300 + 1, backend.passes
        assert results[0][0].committed_len == sessions["p"].cached_len + 1 and results[1][0] is not None
    finally:
        queue.shutdown()
        for session in sessions.values():
            session.close()


def test_a_new_replys_short_prompt_goes_whole_and_ahead_of_a_long_prefill(llamacpp_target):
    """Beside a 300-token prompt being prefilled, another session's new reply (a 20-token prompt and
    a 2-token draft) runs whole, in the first pass; the long prompt goes in pieces after it. (Its
    short prompt used to be cut into pieces like the long one, each waiting a turn of every
    prefilling session: four Sync-thrashing clients made such a round wait 100 ms at p99.)"""
    from wire.protocol import Verify

    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "ph")
    try:
        jobs = [("p", sessions["p"].verify_work(Verify(seq=1, committed_len=0,
                                                       append=[(7 * i) % 300 + 1 for i in range(300)]))),
                ("h", sessions["h"].verify_work(Verify(seq=1, committed_len=0, append=list(range(1, 21)),
                                                       draft=[5, 6])))]
        run_held(DeviceQueue("test"), jobs)
        assert backend.passes[0] == [("h", 22)], backend.passes
        assert all(name == "p" for members in backend.passes[1:] for name, _ in members), backend.passes
        assert len(backend.passes) > 3, backend.passes  # the long one went in pieces
    finally:
        for session in sessions.values():
            session.close()


async def _stream(sessions: dict, queue: DeviceQueue, made: dict[str, list[int]], name: str, prompt: list[int],
                  n: int) -> None:
    """Session `name` streams `n` tokens after `prompt` through `queue`, as `--mode server` does; what it
    makes goes to made[name]."""
    from remote_verify.server_only import stream_generation
    from wire.protocol import Generate

    request = Generate(seq=1, committed_len=0, append=prompt, max_tokens=n)
    sessions[name].start_generation(request)

    async def send(frame) -> None:
        made[name].extend(frame.tokens)

    await stream_generation(sessions[name], request, queue, send, asyncio.Event())


def _run_and_find_pieces(main, queue, sessions, backend, name: str) -> tuple[list[int], list[int]]:
    """Run `main` on the queue, then close it and the sessions; returns the passes session `name` was
    in and the tokens it fed in each (a prompt's pieces, then a token a pass)."""
    try:
        asyncio.run(main())
    finally:
        queue.shutdown()
        for session in sessions.values():
            session.close()
    passes = [i for i, members in enumerate(backend.passes) if any(member == name for member, _ in members)]
    pieces = [tokens for members in backend.passes for member, tokens in members if member == name]
    return passes, pieces


def test_a_new_streams_long_prompt_runs_in_pieces_while_another_stream_goes_on(llamacpp_target):
    """A stream (`--mode server`, and the default mode's passes) starting on a 300-token prompt
    while another session streams: its prompt goes in pieces, the other stream's passes between
    them, and its tokens are still the target's alone. (A stream's pass used to run its whole
    prompt in one turn: every other user's next token waited for a new user's prefill.)"""
    from tests.local_draft.test_fallback import target_alone

    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "sp")
    short, long_prompt = [5, 6, 7, 8, 9], [(7 * i) % 300 + 1 for i in range(300)]
    made: dict[str, list[int]] = {"s": [], "p": []}
    queue = DeviceQueue("test")

    stream = partial(_stream, sessions, queue, made)

    async def main() -> None:
        streaming = asyncio.ensure_future(stream("s", short, 400))
        while len(made["s"]) < 3:  # the first stream is under way
            await asyncio.sleep(0.001)
        await stream("p", long_prompt, 3)
        await streaming

    p_passes, pieces = _run_and_find_pieces(main, queue, sessions, backend, "p")
    assert max(pieces) < 299 and sum(pieces) == 300 + 2, pieces  # in pieces; then two more tokens, one a pass
    between = [i for i in range(p_passes[0], p_passes[-1]) if any(name == "s" for name, _ in backend.passes[i])]
    assert len(between) >= len(pieces) // 2, backend.passes  # the other stream kept making tokens meanwhile
    assert made["p"] == target_alone(llamacpp_target, long_prompt, 3)
    assert made["s"] == target_alone(llamacpp_target, short, 400)


def test_a_new_replys_first_pass_is_the_pass_right_after_its_start(llamacpp_target, tmp_path):
    """A reply accepted on the device (`stream_generation` with `started`: the start is the stream's
    first item) has its first pass queued as the start finishes, on the device thread: no pass of the
    other streams runs between its start and its first pass. (Accepted in a turn of its own and its
    stream queued from the event loop, it waited for the pass the worker formed meanwhile: a pass of
    every running stream, a pass's time more before the first token, more when the loop was busy.)
    Traced, each reply's first token came when its start was queued, before the start ran."""
    from benchmarks.pass_trace_report import read
    from remote_verify.pass_trace import PassTrace
    from remote_verify.server_only import stream_generation
    from wire.protocol import Generate

    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "sn")
    made: dict[str, list[int]] = {"s": [], "n": []}
    queue = DeviceQueue("test")
    queue.trace = PassTrace(tmp_path / "passes.jsonl")
    starts_at: list[int] = []  # the passes run when each start of "n" ran (on the device thread)
    start_times: list[float] = []  # ... and when
    start = sessions["n"].start_generation
    sessions["n"].start_generation = lambda request: (starts_at.append(len(backend.passes)),
                                                      start_times.append(time.perf_counter()), start(request))[2]

    async def send(frame) -> None:
        made["n"].extend(frame.tokens)

    async def main() -> None:
        streaming = asyncio.ensure_future(_stream(sessions, queue, made, "s", [5, 6, 7, 8, 9], 400))
        for _ in range(3):  # three replies, each started while the other stream runs
            while len(made["s"]) < 3 + 20 * len(starts_at):
                await asyncio.sleep(0.001)
            started = asyncio.get_running_loop().create_future()
            request = Generate(seq=len(starts_at) + 1, committed_len=len(sessions["n"].committed), append=[3, 4, 5],
                               max_tokens=2)
            await stream_generation(sessions["n"], request,
                                    queue, send, asyncio.Event(), started=started)
            assert started.result() is None
        await streaming

    n_passes, _ = _run_and_find_pieces(main, queue, sessions, backend, "n")
    firsts = [next(i for i in n_passes if i >= at) for at in starts_at]
    assert len(starts_at) == 3 and firsts == starts_at, (starts_at, firsts, backend.passes)
    assert len(made["n"]) == 6
    queue.trace.close()
    arrivals = [arrived for each in read(tmp_path / "passes.jsonl") for session, _, arrived in each.first
                if session == str(sessions["n"].id)]
    assert len(arrivals) == 3 and all(arrived < ran for arrived, ran in zip(arrivals, start_times)), (arrivals,
                                                                                                     start_times)


def test_a_new_replys_long_prompt_does_not_wait_for_a_stream_charged_less(llamacpp_target):
    """A session that streamed a reply and starts another with a long prompt: its first piece runs within
    a couple of passes of its start, although a stream that began later (credited, so charged less) is
    the least charged session for many passes: after a pass without a piece, the least charged
    prefill's piece is due (by charge alone it waited for that stream to catch up: 19 passes here)."""
    from remote_verify.server_only import stream_generation
    from wire.protocol import Generate

    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "snl")
    made: dict[str, list[int]] = {"s": [], "n": [], "l": []}
    queue = DeviceQueue("test")
    starts_at: list[int] = []
    start = sessions["n"].start_generation
    sessions["n"].start_generation = lambda request: (starts_at.append(len(backend.passes)), start(request))[1]
    long_prompt = [(7 * i) % 300 + 1 for i in range(300)]

    async def send(frame) -> None:
        made["n"].extend(frame.tokens)

    async def main() -> None:
        streaming = asyncio.ensure_future(_stream(sessions, queue, made, "s", [5, 6, 7, 8, 9], 400))
        while len(made["s"]) < 3:
            await asyncio.sleep(0.001)
        await stream_generation(sessions["n"], Generate(seq=1, committed_len=0, append=[3, 4, 5], max_tokens=20),
                                queue, send, asyncio.Event(), started=asyncio.get_running_loop().create_future())
        late = asyncio.ensure_future(_stream(sessions, queue, made, "l", [9, 8, 7], 300))
        while len(made["l"]) < 3:  # the late stream is under way, charged a credit below the others
            await asyncio.sleep(0.001)
        request = Generate(seq=2, committed_len=len(sessions["n"].committed), append=long_prompt, max_tokens=2)
        await stream_generation(sessions["n"], request, queue, send, asyncio.Event(),
                                started=asyncio.get_running_loop().create_future())
        await asyncio.gather(streaming, late)

    n_passes, pieces = _run_and_find_pieces(main, queue, sessions, backend, "n")
    first_piece = next(i for i in n_passes if i >= starts_at[1])
    assert first_piece - starts_at[1] <= 2, (starts_at, n_passes, pieces)
    after = pieces[-len([i for i in n_passes if i >= starts_at[1]]):]
    assert max(after) < 300 and sum(after) >= 300, pieces  # the prompt in pieces, then a token


def _gpu_like_curve():
    """A queue's cost curve like a GPU's (a pass of 60 tokens about twice one of 1), fixed: a first
    piece is then about 60 tokens."""
    from remote_verify.pass_costs import PassCosts

    costs = PassCosts()
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        costs.observe(n, 0.010 + 0.0002 * n)
    costs.observe = lambda *args, **kwargs: None  # the curve stays as given
    return costs


def test_a_prompts_pieces_are_charged_by_their_cost_so_they_come_every_few_passes(llamacpp_target):
    """On a GPU-like curve (a pass of 60 tokens about twice one of 1), a 300-token prompt goes in pieces
    (the first of at most about 60) while three streams go on, and its pieces come every other pass or so: a piece
    is charged its cost, not its tokens (charged 60, the session waited 54 passes for the streams to
    feed 60 tokens each, a pass at a time, before its next piece)."""
    costs = _gpu_like_curve()
    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "abcp")
    long_prompt = [(7 * i) % 300 + 1 for i in range(300)]
    made: dict[str, list[int]] = {name: [] for name in "abcp"}
    queue = DeviceQueue("charge-test", costs=costs)

    stream = partial(_stream, sessions, queue, made)

    async def main() -> None:
        streaming = [asyncio.ensure_future(stream(name, [5, 6, 7 + i], 300)) for i, name in enumerate("abc")]
        while min(len(made[name]) for name in "abc") < 3:
            await asyncio.sleep(0.001)
        await stream("p", long_prompt, 2)
        await asyncio.gather(*streaming)

    p_passes, pieces = _run_and_find_pieces(main, queue, sessions, backend, "p")
    # in pieces: the first priced by the curve (about 60), each later one by the timing of the one before, at most
    # twice it (`_cut_limit`: measured on this machine's cores, 30 to 45 tokens quiet, 3 to 92 in a busy suite),
    # or by the curve again where a piece has no timing to go by (the streams idle a moment on a busy machine)
    assert len(pieces) >= 4 and pieces[0] <= 80, pieces
    assert all(later <= max(2 * earlier, 80) for earlier, later in zip(pieces, pieces[1:])), pieces
    gaps = [later - earlier for earlier, later in zip(p_passes, p_passes[1:])]
    assert max(gaps) <= 4, (p_passes, pieces)  # a piece every other pass or so, while the streams go on


@pytest.mark.parametrize("prompt_tokens, whole", [(80, True), (130, False)])
def test_a_prompt_of_about_one_piece_goes_whole_not_a_piece_and_a_tail(llamacpp_target, prompt_tokens, whole):
    """While three streams go on, an 80-token prompt (a piece and a third, on a curve whose piece is about
    60) goes whole in one pass: cut, its 20-token tail waited a turn of its own, and its first token two
    passes more. One of 130 still goes in pieces."""
    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "abcp")
    made: dict[str, list[int]] = {name: [] for name in "abcp"}
    queue = DeviceQueue("whole-test", costs=_gpu_like_curve())
    stream = partial(_stream, sessions, queue, made)

    async def main() -> None:
        streaming = [asyncio.ensure_future(stream(name, [5, 6, 7 + i], 40)) for i, name in enumerate("abc")]
        while min(len(made[name]) for name in "abc") < 3:
            await asyncio.sleep(0.001)
        await stream("p", [(7 * i) % 300 + 1 for i in range(prompt_tokens)], 2)
        await asyncio.gather(*streaming)

    _, pieces = _run_and_find_pieces(main, queue, sessions, backend, "p")
    if whole:
        assert pieces[0] == prompt_tokens, pieces
    else:
        assert pieces[0] <= 80, pieces  # a piece of about 60


def _early_rising_curve():
    """A queue's cost curve like the RTX 3090's serving an 8B model with llama.cpp (benchmarks/emulation/profiles/
    rtx3090-llamacpp-8b-q4.toml, in ms): dear up to 8 tokens, then nearly flat. A piece against one round
    alone (two passes of 5 tokens) is about 42 tokens; beside sixteen streams (a pass of 16 tokens, 16 ms) a
    pass may take 32 ms, about 108 tokens more."""
    from remote_verify.pass_costs import PassCosts

    costs = PassCosts()
    for n, ms in ((1, 6.4), (2, 7.17), (4, 8.51), (8, 13.76), (16, 16.0), (32, 18.1), (64, 22.9), (128, 32.5)):
        costs.observe(n, ms / 1000)
    costs.observe = lambda *args, **kwargs: None  # the curve stays as given
    return costs


@pytest.mark.parametrize("streams, whole", [(16, True), (6, True), (2, False)])
def test_a_prompt_beside_many_streams_takes_the_room_their_pass_leaves(llamacpp_target, streams, whole):
    """Beside sixteen streams on a curve that rises early and then flattens, a 150-token prompt goes whole in
    one pass: its pass costs less than two of theirs. Priced against one round alone it went in pieces of
    about 42 tokens, one every other pass, and on the emulated RTX 3090 at 64 users prompts came faster than
    that read them (the first token's p99 over a second, in both modes). Beside six streams a piece is about
    53 tokens, but the prompt still goes whole: cut, it would spare their pass 15 ms once and cost its first
    token 25 (`_cut_price`). Beside two (fewer than a round's tokens), pieces of about 42 still."""
    names = "abcdefghijklmnopq"[:streams] + "P"
    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, names)
    made: dict[str, list[int]] = {name: [] for name in names}
    queue = DeviceQueue("beside-test", costs=_early_rising_curve())
    stream = partial(_stream, sessions, queue, made)

    async def main() -> None:
        streaming = [asyncio.ensure_future(stream(name, [5, 6, 7 + i], 40)) for i, name in enumerate(names[:-1])]
        while min(len(made[name]) for name in names[:-1]) < 3:
            await asyncio.sleep(0.001)
        await stream("P", [(7 * i) % 300 + 1 for i in range(150)], 2)
        await asyncio.gather(*streaming)

    _, pieces = _run_and_find_pieces(main, queue, sessions, backend, "P")
    if whole:
        assert pieces[0] == 150, pieces
    else:
        assert 30 <= pieces[0] <= 50, pieces


def _cpu_curve():
    """A queue's cost curve like the 1.5B target's on two CPU cores (a pass of 1 / 5 / 9 tokens: 102 / 360 / 616
    ms), rising with every token."""
    from remote_verify.pass_costs import PassCosts

    costs = PassCosts()
    for n, seconds in ((1, 0.102), (5, 0.360), (9, 0.616)):
        costs.observe(n, seconds)
    return costs


def test_a_pieces_price_beside_streams_never_falls_below_one_rounds():
    """Beside many streams a piece may cost what their pass costs (by the curve of passes of as many members),
    within the room their own tokens leave in the pass's budget; where that is less than a piece priced against
    one round alone (a CPU's curve, which rises with every token), the piece is that one."""
    gpu = DeviceQueue(name="beside-price", costs=_early_rising_curve())
    cpu = DeviceQueue(name="beside-price-cpu", costs=_cpu_curve())
    try:
        alone = gpu._measured_piece_tokens()
        assert 38 <= alone <= 46, alone
        gpu._plain_beside = 16
        assert 100 <= gpu._measured_piece_tokens() <= 116, gpu._measured_piece_tokens()
        gpu._piece_memo.clear()
        gpu._plain_beside = 64  # 2 x c(64) leaves room for about 150; the pass's budget (260: 4 a member) for 196,
        assert gpu._measured_piece_tokens() == 130  # a piece and a half of 130
        cpu_alone = cpu._measured_piece_tokens()
        cpu._plain_beside = 8
        assert cpu._measured_piece_tokens() == cpu_alone
    finally:
        gpu.shutdown()
        cpu.shutdown()


def test_a_cut_is_priced_by_what_it_spares_the_streams_against_what_it_costs_the_first_token():
    """Beside ten streams on the RTX 3090's curve a 150-token prompt goes whole, not as a piece of 92 and a tail:
    the cut would spare their pass 8.7 ms (c(160) - c(102)) and cost its first token 29 ms (the piece's pass, a
    pass of the streams and the tail's, less the whole pass). On a CPU's curve, which rises with every token, the
    cut spares the streams 9 s and costs the first token 1.4: cut. A prompt the pass's budget cannot hold beside
    the streams is cut whatever the curve, as before."""
    gpu = DeviceQueue(name="cut-price", costs=_early_rising_curve())
    cpu = DeviceQueue(name="cut-price-cpu", costs=_cpu_curve())
    try:
        gpu._plain_beside = cpu._plain_beside = 10
        piece = gpu._measured_piece_tokens()
        assert 88 <= piece <= 96, piece  # 150 is more than a piece and a half
        spared, cost = gpu._cut_price(10, 150, piece)
        assert 0.007 <= spared <= 0.010 and 0.027 <= cost <= 0.031, (spared, cost)
        assert gpu._goes_whole(150, piece)
        assert not gpu._goes_whole(300, piece)  # 300 + 10 streams is beyond the pass's budget (256)
        cpu_piece = cpu._measured_piece_tokens()
        spared, cost = cpu._cut_price(10, 150, cpu_piece)
        assert spared > 5 * cost, (spared, cost)
        assert not cpu._goes_whole(150, cpu_piece)
        gpu._plain_beside = 2  # beside fewer streams than a round's tokens: the piece and a half alone
        assert gpu._cut_price(2, 150, 42) is None and not gpu._goes_whole(150, 42)
    finally:
        gpu.shutdown()
        cpu.shutdown()


def test_a_deep_prefills_later_pieces_are_sized_by_their_own_time():
    """A prefill's piece that took four times a pass of rounds (deep in a long history, where the
    token-keyed curve underprices it) makes its next piece a quarter as long; one that took half
    grows it, at most to twice the last; alone, pieces stay a batch long."""
    import remote_verify.scheduler as scheduler
    from remote_verify.scheduler import _Item

    queue = DeviceQueue("test")
    try:
        queue._round_s = 0.001
        queue._seen["other"] = time.monotonic()  # another session sent a round just now
        item = _Item(work=None, future=None, loop=None, cut=True, piece_tokens=16, piece_s=0.004)
        assert queue._cut_limit(item, 16, "p") == 4
        item.piece_shared = True  # rounds were in that pass: they waited 3 ms more, not 4
        assert queue._cut_limit(item, 16, "p") == 5
        item.piece_shared = False
        item.piece_s = 0.0005
        assert queue._cut_limit(item, 16, "p") == 32
        queue._seen.clear()  # nobody else for a while
        assert queue._cut_limit(item, scheduler.ALONE_PIECE_TOKENS, "p") == scheduler.ALONE_PIECE_TOKENS
    finally:
        queue.shutdown()


def test_a_long_feed_alone_runs_whole(llamacpp_target):
    """With no other session active, a 300-token prompt is one pass: a single user's first token
    pays nothing for the pieces."""
    import remote_verify.scheduler as scheduler
    from wire.protocol import Verify

    backend = RecordingBackend(llamacpp_target)
    session = _sessions(backend, "p")["p"]
    queue = DeviceQueue("test")
    queue._seen.clear()
    try:
        async def main():
            await asyncio.sleep(scheduler.ACTIVE_S)  # nobody else has sent work lately
            return await queue.run("p", session.verify_work(Verify(seq=1, committed_len=0, append=list(range(1, 301)))))

        asyncio.run(main())
    finally:
        queue.shutdown()
        session.close()
    assert backend.passes == [[("p", 300)]]


def test_the_pieces_of_a_cancelled_feed_stop(llamacpp_target):
    """A 300-token prompt beside other sessions' rounds, cancelled (its client has gone) while its
    pieces run: no further piece runs for it (one in flight at the cancel may end)."""
    from wire.protocol import Verify

    from remote_verify.pass_costs import PassCosts

    backend = RecordingBackend(llamacpp_target)
    sessions = _sessions(backend, "px")
    # the curve measured before sessions are taken, as the service's is (`calibrate`): from one timed
    # round alone the curve is flat, and a round slowed by a busy machine made the whole prompt one piece
    costs = PassCosts()
    costs.calibrate(llamacpp_target)
    queue = DeviceQueue("test", costs=costs)
    pieces_at_cancel = []

    def pieces_run() -> list[int]:
        return [tokens for members in list(backend.passes) for name, tokens in members if name == "p"]

    try:
        async def main():
            prompt = asyncio.ensure_future(queue.run("p", sessions["p"].verify_work(
                Verify(seq=1, committed_len=0, append=[(3 * i) % 300 + 1 for i in range(300)]))))
            for seq in range(1, 30):
                held = len(sessions["x"].committed)
                await queue.run("x", sessions["x"].verify_work(Verify(seq=seq, committed_len=held,
                                                                      append=[] if held else [3, 4])))
                if not pieces_at_cancel and pieces_run():  # its first piece has run
                    pieces_at_cancel.extend(pieces_run())
                    prompt.cancel()
            with pytest.raises(asyncio.CancelledError):
                await prompt

        asyncio.run(main())
    finally:
        queue.shutdown()
        for session in sessions.values():
            session.close()
    pieces = pieces_run()
    assert 1 <= len(pieces_at_cancel) and len(pieces) <= len(pieces_at_cancel) + 1 and sum(pieces) < 299, \
        (pieces_at_cancel, pieces)


def test_a_prefill_piece_is_sized_by_the_curve_timed_on_the_queue():
    """A piece costs at most two one-round passes by the passes the queue timed: on a curve that
    stays flat for hundreds of tokens (a GPU) a prompt goes in one piece, on one that grows with
    every token (a CPU) in pieces of about ten. Sized by a stand-in backend's prices instead, an
    emulated GPU cut every prompt into pieces of five and made a first token wait a second."""
    import remote_verify.scheduler as scheduler
    from remote_verify.pass_costs import PassCosts

    def queue_with(curve):
        costs = PassCosts()
        for n, seconds in curve:
            costs.observe(n, seconds)
        return DeviceQueue(name="piece-test", costs=costs)

    gpu = queue_with([(1, 0.0055), (16, 0.0059), (512, 0.0183)])
    cpu = queue_with([(1, 0.102), (5, 0.360), (9, 0.616)])
    try:
        assert gpu._measured_piece_tokens() >= 200
        assert 8 <= cpu._measured_piece_tokens() <= 12
        assert DeviceQueue(name="unmeasured")._measured_piece_tokens() is None
        # alone: a whole batch where it is quick, what takes ALONE_PIECE_S where it is not (a batch of
        # the 1.5B on two CPU cores took 31 s, and a session arriving meanwhile waited all of it)
        assert gpu._piece_limit("p", None) == scheduler.ALONE_PIECE_TOKENS
        assert 30 <= cpu._piece_limit("p", None) <= 33
    finally:
        gpu.shutdown()
        cpu.shutdown()


def test_a_piece_is_priced_by_passes_of_one_session_not_by_crowded_ones():
    """Passes of 128 streams cost more at the same sizes than one session's: a piece is sized against a
    one-session round by passes of one session, whatever crowded passes the queue also timed (priced
    by every pass, a first token under load waited for a prompt cut into pieces of a few dozen)."""
    from remote_verify.pass_costs import PassCosts

    costs = PassCosts()
    for n in (1, 2, 4, 8, 16):  # the calibration: one session, the emulated 70B (flat, then 0.089 ms a token)
        costs.observe(n, 0.0186 + 0.00008 * (n - 1))
    for n in range(128, 257, 4):  # a hundred and twenty-eight streams with a guess or so each
        costs.observe(n, 0.041 + 0.000089 * (n - 128), members=128)
    queue = DeviceQueue(name="crowded-piece-test", costs=costs)
    try:
        assert queue._measured_piece_tokens() >= 200  # c1(n) <= 2 c1(5): 23.62 + 0.089 (n - 64) <= 37.3 ms
    finally:
        queue.shutdown()


def test_bookkeeping_goes_ahead_of_the_line_by_charge(recorder):
    """Starting a stream or a Sync runs no pass: it goes first, ahead of sessions charged less, so a
    session back with a new reply does not wait for every stream to catch up with its charge."""
    from remote_verify.scheduler import Bookkeeping

    queue = DeviceQueue(name="bookkeeping-test")
    ran = []
    gate = threading.Event()

    async def scenario():
        blocker = asyncio.ensure_future(queue.run("busy", gate.wait))  # holds the device thread
        await asyncio.sleep(0.05)
        queue._charged["heavy"] = 1000.0  # a session that fed a long prompt: charged far ahead
        queue._charged["light"] = 0.0
        light = asyncio.ensure_future(queue.run("light", lambda: ran.append("light")))
        heavy = asyncio.ensure_future(queue.run("heavy", Bookkeeping(lambda: ran.append("heavy"))))
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(blocker, light, heavy)

    try:
        asyncio.run(scenario())
    finally:
        queue.shutdown()
    assert ran == ["heavy", "light"]
