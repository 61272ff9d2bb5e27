"""The latency proxy: a real service behind an emulated round trip, and the loop on such a link."""

from __future__ import annotations

import time
import urllib.request

import pytest

from app.latency_proxy import LatencyProxy
from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient
from wire.protocol import SamplingParams, Verify
from tests.conftest import hello_for

RTT_MS = 40.0
JITTER_MS = 10.0  # each round trip lands within RTT_MS +- JITTER_MS


@pytest.fixture(scope="module")
def far_service(service_on):
    """The llama.cpp service, RTT_MS away."""
    proxy = LatencyProxy(service_on("llamacpp").url, rtt_ms=RTT_MS, jitter_ms=JITTER_MS, seed=1)
    proxy.start_in_thread()
    yield proxy
    proxy.stop()


def test_every_round_trip_takes_at_least_the_emulated_time(far_service, close_draft):
    """k = 0 rounds through the proxy: each takes >= RTT_MS - JITTER_MS; HTTP goes through too."""
    client = VerifyClient(far_service.url, hello_for(close_draft))
    prompt = close_draft.tokenize("hello")
    for seq in range(1, 6):
        started = time.perf_counter()
        verdict = client.verify(Verify(seq=seq, committed_len=0 if seq == 1 else len(prompt) + seq - 1,
                                       append=prompt if seq == 1 else [], draft=[]))
        assert time.perf_counter() - started >= (RTT_MS - JITTER_MS) / 1000
        assert verdict.committed_len == len(prompt) + seq
    client.close()
    health = far_service.url.replace("ws://", "http://") + "/healthz"
    with urllib.request.urlopen(health, timeout=5) as response:
        assert response.status == 200


def test_adaptive_k_drafts_ahead_on_a_far_link_and_keeps_parity(far_service, service_on, close_draft):
    """40 ms away, adaptive k drafts long blocks (drafting pays), drafts ahead, and the text is the target's."""
    near = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    far = VerifyClient(far_service.url, hello_for(close_draft))
    # a long prompt: its prefill in the first round must not pass for the cost of drafting
    prompt = close_draft.tokenize("# Sorting helpers for the report builder.\n" * 6 + "def quicksort(arr):")
    assert len(prompt) > 100
    reference = Speculator(close_draft, near, SamplingParams(), k=0).generate(prompt, 80)
    result = Speculator(close_draft, far, SamplingParams(), k=None, pipeline=True).generate(prompt, 80)
    near.close()
    far.close()
    assert result.token_ids == reference.token_ids
    stats = result.stats
    assert stats.tokens_per_round > 2 and stats.ahead_drafted > 0, stats.as_dict()
    assert stats.wire_s >= stats.verified_rounds * (RTT_MS - JITTER_MS) / 1000  # the proxy's time is on the wire


def test_a_proxy_in_front_of_nothing_refuses_cleanly(close_draft):
    """An upstream that is down: the client sees an unreachable service, not a hang."""
    from local_draft.verify_client import ServiceUnreachable

    proxy = LatencyProxy("ws://127.0.0.1:9", rtt_ms=10)
    proxy.start_in_thread()
    try:
        with pytest.raises(ServiceUnreachable):
            VerifyClient(proxy.url, hello_for(close_draft), open_timeout_s=5)
    finally:
        proxy.stop()


def test_bad_proxy_settings_are_clear_errors():
    """A negative round trip or an upstream without a port says what is wrong."""
    with pytest.raises(ValueError, match="negative"):
        LatencyProxy("ws://127.0.0.1:8765", rtt_ms=-1)
    with pytest.raises(ValueError, match="HOST:PORT"):
        LatencyProxy("ws://127.0.0.1", rtt_ms=10)


def test_a_proxy_in_a_process_of_its_own_relays_with_the_round_trip_and_stops(service_on, close_draft):
    """`start_in_process` (benchmarks.load's: the link must not wait on the users' threads): the proxy runs
    in another process, every round trip through it takes at least the emulated time, faults on demand
    say they need the thread, and once stopped its process is gone and its port refuses."""
    import os
    import socket

    proxy = LatencyProxy(service_on("llamacpp").url, rtt_ms=RTT_MS)
    url = proxy.start_in_process()
    process = proxy._process
    try:
        assert process is not None and process.is_alive() and process.pid != os.getpid()
        client = VerifyClient(url, hello_for(close_draft))
        prompt = close_draft.tokenize("hello")
        for seq in range(1, 4):
            started = time.perf_counter()
            verdict = client.verify(Verify(seq=seq, committed_len=0 if seq == 1 else len(prompt) + seq - 1,
                                           append=prompt if seq == 1 else [], draft=[]))
            assert time.perf_counter() - started >= RTT_MS / 1000
            assert verdict.committed_len == len(prompt) + seq
        client.close()
        with pytest.raises(RuntimeError, match="start_in_thread"):
            proxy.drop_all()
    finally:
        proxy.stop()
    assert not process.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()


def test_a_proxy_process_that_cannot_listen_says_why():
    """A port already taken: start_in_process raises with the reason, and leaves no process behind."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proxy = LatencyProxy("ws://127.0.0.1:9", rtt_ms=10, port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="cannot listen"):
            proxy.start_in_process()
        assert proxy._process is None
