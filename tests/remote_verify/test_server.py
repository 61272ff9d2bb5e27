"""The real WebSocket service on port 0: handshake, refusals, health, and auth."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from local_draft.verify_client import VerifyClient, VerifyError
from wire.protocol import (
    SUBPROTOCOL, Error, Hello, Sync, Verdict, Verify, Welcome, decode_server_message, encode,
)
from tests.conftest import RunningService, hello_for


def _raw(url: str):
    return connect(url, subprotocols=[SUBPROTOCOL])


def test_a_drafter_with_another_vocabulary_is_refused(service, close_draft):
    """A vocabulary mismatch gets a fatal error that says the vocabularies differ."""
    hello = hello_for(close_draft)
    wrong = Hello(vocab_fingerprint="0" * 32, vocab_size=hello.vocab_size, bos_id=0, eos_id=1)
    with pytest.raises(VerifyError) as error:
        VerifyClient(service.url, wrong)
    assert error.value.code == "vocab_mismatch" and error.value.fatal
    assert "vocabulary" in str(error.value) and "differs" in str(error.value)


def test_bad_requests_get_errors_and_other_sessions_go_on(service, close_draft):
    """Out-of-range ids, stale sequence numbers and garbage frames are answered, not fatal."""
    other = VerifyClient(service.url, hello_for(close_draft))
    with _raw(service.url) as ws:
        ws.send(encode(hello_for(close_draft)))
        assert isinstance(decode_server_message(ws.recv()), Welcome)
        ws.send(encode(Verify(seq=1, committed_len=0, append=[1, 2, 99999])))
        reply = decode_server_message(ws.recv())
        assert isinstance(reply, Error) and reply.code == "bad_token" and "99999" in reply.message
        ws.send(encode(Verify(seq=7, committed_len=0, append=[1, 2])))
        reply = decode_server_message(ws.recv())
        assert isinstance(reply, Error) and reply.code == "bad_seq" and "expected 1" in reply.message
        ws.send(b"\xc1 not msgpack")
        reply = decode_server_message(ws.recv())
        assert isinstance(reply, Error) and reply.code == "bad_frame"
        ws.send(encode(Verify(seq=1, committed_len=0, append=[1, 2])))  # the session still works
        assert isinstance(decode_server_message(ws.recv()), Verdict)
    verdict = other.verify(Verify(seq=1, committed_len=0, append=[318, 5], draft=[6]))
    assert verdict.committed_len in (3, 4)
    other.close()


def test_healthz_answers_over_plain_http(service):
    """/healthz is served on the WebSocket port."""
    http_url = service.url.replace("ws://", "http://") + "/healthz"
    with urllib.request.urlopen(http_url, timeout=5) as response:
        assert response.status == 200 and response.read() == b"ok\n"


def test_a_failed_device_queue_answers_its_sessions_and_turns_healthz_red(own_llamacpp_target, close_draft,
                                                                          monkeypatch):
    """The device queue's worker failing outside any pass (a bug in choosing the next turn): the
    session waiting gets an error at once, not silence, and /healthz answers 503 saying the service
    must be restarted (a load balancer then sends no one there)."""
    running = RunningService(own_llamacpp_target)
    try:
        client = VerifyClient(running.url, hello_for(close_draft))

        def broken(line):
            raise KeyError("a bug in the line")

        # this service's queue only: patched on the class, the fault closed the queue of the service that
        # other tests on this worker share (a later test then found it shut down)
        monkeypatch.setattr(running.service.queue, "_round_before_piece", broken)
        with pytest.raises(VerifyError) as error:
            client.verify(Verify(seq=1, committed_len=0, append=[318, 5], draft=[6]))
        assert error.value.code == "internal" and "a bug in the line" in str(error.value) \
            and "restarted" in str(error.value), error.value
        client.close()
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(running.url.replace("ws://", "http://") + "/healthz", timeout=5)
        assert health.value.code == 503 and b"restart the service" in health.value.read()
    finally:
        monkeypatch.undo()
        running.close()


def test_a_missing_or_wrong_token_gets_401(own_llamacpp_target, close_draft):
    """With a token set, the upgrade needs the bearer token."""
    guarded = RunningService(own_llamacpp_target, token="s3cret")
    try:
        for token, words in ((None, "missing bearer token"), ("nope", "wrong bearer token")):
            with pytest.raises(VerifyError) as error:
                VerifyClient(guarded.url, hello_for(close_draft), token=token)
            assert error.value.code == "http_401" and words in str(error.value)
        client = VerifyClient(guarded.url, hello_for(close_draft), token="s3cret")
        assert client.welcome.vocab_size == close_draft.vocab_size
        client.close()
    finally:
        guarded.close()


def test_concurrent_sessions_share_passes_and_each_equals_the_target_alone(tiny):
    """Six speculating sessions (k = 4) and two server-only streams at once on one service:
    their rounds and tokens share forward passes (more rounds than passes), and every greedy
    reply equals the target alone."""
    import threading

    from local_draft.draft_model import DraftModel
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.speculator import Speculator
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget
    from tests.conftest import TINY_THREADS
    from tests.local_draft.test_fallback import target_alone
    from wire.protocol import SamplingParams

    target = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS)  # this service's alone
    drafts = [DraftModel(tiny.draft, n_ctx=1024, n_threads=1) for _ in range(8)]  # loaded one after another
    prompts = [drafts[0].tokenize(text) for text in ("def quicksort(arr):", "The quick brown fox", "while True:")]
    expected = [target_alone(target, prompt, 40) for prompt in prompts]
    running = RunningService(target)
    replies: dict[int, list[list[int]]] = {}
    problems: list[str] = []
    start = threading.Barrier(8)

    def session(index: int) -> None:
        try:
            client = VerifyClient(running.url, hello_for(drafts[index]))
            if index < 6:
                generate = Speculator(drafts[index], client, SamplingParams(), k=4).generate
            else:
                generate = ServerOnlyGenerator(client, ()).generate
            start.wait(30)
            replies[index] = [generate(prompts[(index + i) % 3], 40).token_ids for i in range(3)]
            client.close()
        except Exception as exc:  # reported below, never raised from a thread
            problems.append(f"session {index}: {type(exc).__name__}: {exc}")
            start.abort()

    threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        queue = running.service.queue
        assert problems == []
        for index, got in replies.items():
            assert got == [expected[(index + i) % 3] for i in range(3)], f"session {index}"
        assert len(replies) == 8
        assert queue.shared_items > 1.5 * queue.passes, (queue.shared_items, queue.passes)
    finally:
        running.close()


def test_a_session_finding_no_kv_memory_is_refused_with_a_retry_hint(tiny):
    """A KV pool llama.cpp cannot create refuses the session at its first round (the Welcome does not
    wait for a pool) with sessions_full and when to come back; the service goes on answering health
    checks. (The failure is provoked by asking for more sequences than llama.cpp allows, which it
    refuses at once: an allocation that really fails would first take this machine's memory.)"""
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget
    from tests.conftest import TINY_THREADS

    class NoMemoryTarget(LlamaCppTarget):
        def context_params(self, slots):
            params = super().context_params(slots)
            params.n_seq_max = 100_000  # over LLAMA_MAX_SEQ: llama.cpp refuses the context
            return params

    from local_draft.draft_model import DraftModel

    draft = DraftModel(tiny.draft, n_ctx=256, n_threads=1)
    running = RunningService(NoMemoryTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS))
    try:
        client = VerifyClient(running.url, hello_for(draft))
        with pytest.raises(VerifyError) as error:
            client.verify(Verify(seq=1, committed_len=0, append=[1, 2]))
        client.close()
        assert error.value.code == "sessions_full" and error.value.fatal
        assert "KV memory" in str(error.value) and "reconnect in a few seconds" in str(error.value)
        with urllib.request.urlopen(running.url.replace("ws://", "http://") + "/healthz", timeout=5) as response:
            assert response.status == 200
    finally:
        running.close()


def test_a_seeded_sampled_session_draws_the_same_tokens_alone_and_beside_others(tiny):
    """Sampling (temperature 0.9, seeded): a session's tokens are the same verified alone and
    while five other sessions share its passes, since its logits keep their bits and its draws
    are keyed by (seed, position), never by what else ran."""
    import threading

    from local_draft.draft_model import DraftModel
    from local_draft.speculator import Speculator
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget
    from tests.conftest import TINY_THREADS
    from wire.protocol import SamplingParams

    params = SamplingParams(temperature=0.9)
    drafts = [DraftModel(tiny.draft, n_ctx=1024, n_threads=1) for _ in range(6)]
    prompt = drafts[0].tokenize("def quicksort(arr):")
    running = RunningService(LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS))

    def sampled() -> list[int]:
        client = VerifyClient(running.url, hello_for(drafts[0], params, seed=11))
        try:
            return Speculator(drafts[0], client, params, k=4, seed=5).generate(prompt, 60).token_ids
        finally:
            client.close()

    done, problems = threading.Event(), []

    def neighbour(index: int) -> None:
        try:
            client = VerifyClient(running.url, hello_for(drafts[index], params, seed=index))
            speculator = Speculator(drafts[index], client, params, k=3 + index % 3, seed=index)
            while not done.is_set():
                speculator.generate(drafts[index].tokenize("The quick brown fox"), 30)
            client.close()
        except Exception as exc:  # reported below, never raised from a thread
            problems.append(f"neighbour {index}: {type(exc).__name__}: {exc}")

    try:
        alone = sampled()
        passes_alone, items_alone = running.service.queue.passes, running.service.queue.shared_items
        threads = [threading.Thread(target=neighbour, args=(i,), daemon=True) for i in range(1, 6)]
        for thread in threads:
            thread.start()
        beside = sampled()
        done.set()
        for thread in threads:
            thread.join(60)
        queue = running.service.queue
        assert problems == []
        assert beside == alone and len(alone) == 60
        assert queue.shared_items - items_alone > 1.5 * (queue.passes - passes_alone)  # they did share passes
    finally:
        done.set()
        running.close()


class SlowPoolTarget:
    """The real tiny target, taking POOL_S to allocate each session's cache (a pool growing on a CPU:
    1.4 s for eight slots of the default 1.5B), on the device thread as the real one does."""

    POOL_S = 0.4

    def __init__(self, target):
        self.target = target

    def __getattr__(self, name):
        return getattr(self.target, name)

    def new_cache(self):
        import time

        time.sleep(self.POOL_S)
        return self.target.new_cache()


def test_clients_arriving_together_are_all_welcomed_while_pools_are_allocated(own_llamacpp_target, close_draft):
    """Eight server-only clients at once, each with a 1 s stall timeout, against a service whose caches
    take 0.4 s each to allocate (3.2 s in all, one after another): every client is welcomed without
    waiting for an allocation, waits out its first frame while the service answers pings, and gets
    the target's own tokens. (Sessions used to open one by one behind the allocations, and the later
    clients gave up: "did not answer within 1 s".)"""
    import threading

    from local_draft.server_only import ServerOnlyGenerator
    from tests.local_draft.test_fallback import target_alone

    prompt = close_draft.tokenize("def quicksort(arr):")
    expected = target_alone(own_llamacpp_target, prompt, 12)
    running = RunningService(SlowPoolTarget(own_llamacpp_target))
    results, errors = [None] * 8, []

    def one(i: int) -> None:
        try:
            client = VerifyClient(running.url, hello_for(close_draft), open_timeout_s=1.0, stall_timeout_s=1.0)
            try:
                results[i] = ServerOnlyGenerator(client, close_draft.end_ids).generate(prompt, 12).token_ids
            finally:
                client.close()
        except Exception as exc:  # reported below
            errors.append(f"client {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        running.close()
    assert errors == [] and results == [expected] * 8, (errors, results)


def test_the_service_shrinks_a_pool_its_sessions_have_left_after_a_while(tiny, close_draft, monkeypatch):
    """Three sessions come and go beside one that stays: the pool of 4 they grew is kept (the next
    comers take its slots), and the service's periodic tidy shrinks it to 1 once it has been quiet
    for POOL_KEEP_S (here 0.3 s, checked every 0.1 s)."""
    import time

    import remote_verify.backends.llamacpp_backend as llamacpp_backend
    import remote_verify.server as server
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget
    from tests.conftest import TINY_THREADS

    monkeypatch.setattr(llamacpp_backend, "POOL_KEEP_S", 0.3)
    monkeypatch.setattr(server, "TIDY_EVERY_S", 0.1)
    target = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS, max_context=256)
    running = RunningService(target)
    try:
        stays = VerifyClient(running.url, hello_for(close_draft))
        stays.verify(Verify(seq=1, committed_len=0, append=[1, 2]))
        comers = [VerifyClient(running.url, hello_for(close_draft)) for _ in range(3)]
        for client in comers:
            client.verify(Verify(seq=1, committed_len=0, append=[3, 4]))
        assert [pool.slots for pool in target._pools] == [4]
        for client in comers:
            client.close()
        deadline = time.monotonic() + 10
        while [pool.slots for pool in target._pools] != [1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pool.slots for pool in target._pools] == [1]
        assert stays.verify(Verify(seq=2, committed_len=3, draft=[5])).committed_len in (4, 5)  # moved, still works
        stays.close()
    finally:
        running.close()


def test_a_client_gone_mid_prefill_takes_no_more_device_time(own_llamacpp_target, close_draft):
    """A client sends a 3,000-token prompt beside a busy neighbour (so it is fed in short pieces, each
    made 50 ms long here) and hangs up: its session closes within seconds, not after the minute its
    remaining pieces would have taken, and the neighbour goes on."""
    import threading
    import time

    class SlowPasses:
        def __init__(self, target):
            self.target = target

        def __getattr__(self, name):
            return getattr(self.target, name)

        def forward_many(self, passes):
            time.sleep(0.05)
            return self.target.forward_many(passes)

    running = RunningService(SlowPasses(own_llamacpp_target))
    stop, rounds = threading.Event(), [0]

    def neighbour():
        client = VerifyClient(running.url, hello_for(close_draft))
        client.verify(Verify(seq=1, committed_len=0, append=[1, 2]))
        seq = 1
        while not stop.is_set():
            seq += 1
            client.sync(Sync(seq=seq, tokens=[1, 2]))
            seq += 1
            client.verify(Verify(seq=seq, committed_len=2))
            rounds[0] += 1
        client.close()

    thread = threading.Thread(target=neighbour, daemon=True)
    thread.start()
    try:
        with _raw(running.url) as ws:
            ws.send(encode(hello_for(close_draft)))
            ws.recv(timeout=10)
            ws.send(encode(Verify(seq=1, committed_len=0, append=[(7 * i) % 300 + 1 for i in range(3000)])))
            time.sleep(0.5)  # a few pieces run
        gone = time.monotonic()
        while len(running.service.sessions) > 1 and time.monotonic() - gone < 30:
            time.sleep(0.05)
        took = time.monotonic() - gone
        before = rounds[0]
        time.sleep(0.5)
        assert took < 5, took
        assert rounds[0] > before  # the neighbour goes on
    finally:
        stop.set()
        thread.join(30)
        running.close()
