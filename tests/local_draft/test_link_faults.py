"""A user's link stalls or drops mid-reply (the proxy's faults, app/latency_proxy.py): the client
notices a stall within 5 s by its pings, resumes on a new connection from its own history, or,
when nothing answers, goes on offline and says so. Nothing made is lost, and verified text is
the target's alone (greedy)."""

from __future__ import annotations

import logging
import time

import pytest

from app.latency_proxy import LatencyProxy
from app.link_faults import ConnectionFaults, LinkFaults
from local_draft.service_link import LinkState, ServiceLink
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import PING_INTERVAL_S, PING_TIMEOUT_S
from wire.protocol import SamplingParams
from tests.conftest import RunningService, hello_for
from tests.local_draft.test_fallback import FAST_BACKOFF, target_alone, wait_for

TOKENS = 60
FAULT_AFTER = 15
STALL_BOUND_S = 5.0  # the bound on noticing a stalled link


@pytest.fixture(scope="module")
def own_service(new_llamacpp_target):
    running = RunningService(new_llamacpp_target())
    yield running
    running.close()


@pytest.fixture(scope="module")
def reference_target(new_llamacpp_target):
    return new_llamacpp_target()  # not the service's: a backend belongs to one device thread


@pytest.fixture
def proxy(own_service):
    # 20 ms each way keeps the stream's frames on the wire when a fault strikes
    relay = LatencyProxy(own_service.url, rtt_ms=40, seed=3)
    relay.start_in_thread()
    yield relay
    relay.stop()


def test_the_pings_bound_the_time_to_notice_a_stall():
    assert PING_INTERVAL_S + PING_TIMEOUT_S < STALL_BOUND_S


@pytest.mark.parametrize("fault", ["stall", "drop"])
def test_a_fault_mid_reply_resumes_on_a_new_connection_with_the_targets_text(proxy, close_draft, reference_target,
                                                                             fault):
    """A 60 s stall (every byte held, nothing closed) or a cut after 15 tokens: a new connection
    within the bound, no offline token, the whole reply the target's."""
    events: list[tuple[float, LinkState]] = []
    link = ServiceLink(proxy.url, hello_for(close_draft), backoff=FAST_BACKOFF,
                       on_state=lambda state: events.append((time.monotonic(), state)))
    struck: list[float] = []
    marks: list[str] = []

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        marks.extend(provenance)
        if len(marks) >= FAULT_AFTER and not struck:
            struck.append(time.monotonic())
            proxy.stall_all(60) if fault == "stall" else proxy.drop_all()

    prompt = close_draft.tokenize("def quicksort(arr):")
    # long enough that the service is still streaming when the client has taken 15 tokens, however
    # loaded the machine: a client slower than the proxy's hold let a short reply finish on the wire
    # before the fault, and no new connection was needed
    tokens = 4 * TOKENS
    try:
        result = StreamSpeculator(close_draft, link, SamplingParams(), max_block=4,
                                  takeover_wait_s=10).generate(prompt, tokens, on_commit)
    finally:
        link.close()
    assert struck and link.connections == 2, (struck, link.connections)
    back_at = next(at for at, state in events if state.connected)
    assert back_at - struck[0] <= STALL_BOUND_S, f"a new connection {back_at - struck[0]:.1f} s after the {fault}"
    assert "offline" not in marks
    assert result.token_ids == target_alone(reference_target, prompt, tokens)


def test_a_stalled_link_with_nothing_behind_it_goes_offline_says_so_and_resumes(own_service, close_draft,
                                                                                reference_target, caplog):
    """The link stalls and the proxy stops taking connections: after the stall is noticed the
    reply goes on offline (logged, and each token marked); when a proxy is back on the same
    port, verification resumes. Every token is kept: the verified ones are the target's."""
    proxy = LatencyProxy(own_service.url, rtt_ms=40)
    proxy.start_in_thread()
    port = proxy.port
    link = ServiceLink(proxy.url, hello_for(close_draft), backoff=FAST_BACKOFF)
    marks: list[str] = []
    stalled: list[float] = []
    relays = [proxy]

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        marks.extend(provenance)
        if len(marks) >= FAULT_AFTER and not stalled:
            stalled.append(time.monotonic())
            proxy.stall_all(60)
            proxy.stop_listening()  # no new connection is taken: the service is out of reach
        if marks.count("offline") == 10 and len(relays) == 1:
            relays.append(LatencyProxy(own_service.url, rtt_ms=40, port=port))
            relays[-1].start_in_thread()
            link.retry_now()
            assert wait_for(lambda: link.current() is not None), "no reconnect"

    prompt = close_draft.tokenize("import numpy as np")
    caplog.set_level(logging.WARNING, logger="local_draft")
    try:
        result = StreamSpeculator(close_draft, link, SamplingParams(), max_block=4).generate(prompt, 80, on_commit)
    finally:
        link.close()
        for relay in relays:
            relay.stop()
    assert len(result.token_ids) == 80 and marks.count("offline") >= 10
    first_offline = marks.index("offline")
    assert first_offline >= FAULT_AFTER
    said = [record.getMessage() for record in caplog.records]
    assert any("the link stalled" in message for message in said), said  # noticed by the pings
    assert any("continuing offline" in message for message in said), said
    resumed = first_offline + marks[first_offline:].index("target")
    assert result.token_ids[:first_offline] == target_alone(reference_target, prompt, first_offline)
    assert result.token_ids[resumed:] == target_alone(reference_target, prompt + result.token_ids[:resumed],
                                                      80 - resumed)


def test_the_faults_repeat_with_a_seed_and_differ_between_connections():
    faults = LinkFaults(rtt_ms=40, jitter_ms=20, stall_every_s=10, stall_s=2, disconnect_every_s=30)

    def schedule(seed, number):
        drawn = ConnectionFaults(faults, seed, number)
        return [drawn.one_way_s() for _ in range(5)] + [drawn.next_stall_in_s(), drawn.next_drop_in_s()]

    assert schedule(1, 0) == schedule(1, 0)
    assert schedule(1, 0) != schedule(1, 1) and schedule(1, 0) != schedule(2, 0)
    assert all(0.0 <= delay <= 0.03 for delay in schedule(1, 0)[:5])  # 20 ms +- 10 ms each way


def test_the_bandwidth_cap_paces_a_transfer(own_service):
    """200 kbit/s: the 25 KB answer of a /metrics request cannot arrive in less than its time on the wire."""
    import urllib.request

    relay = LatencyProxy(own_service.url, faults=LinkFaults(bandwidth_kbps=200))
    relay.start_in_thread()
    try:
        began = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{relay.port}/metrics", timeout=30) as response:
            size = len(response.read())
        took = time.monotonic() - began
    finally:
        relay.stop()
    assert took >= size * 8 / 200_000 * 0.9, (size, took)


def test_bad_fault_settings_are_clear_errors():
    with pytest.raises(ValueError, match="--stall-every needs --stall-s"):
        LatencyProxy("ws://127.0.0.1:8765", faults=LinkFaults(stall_every_s=5))
    with pytest.raises(ValueError, match="--bandwidth-kbps cannot be negative"):
        LatencyProxy("ws://127.0.0.1:8765", faults=LinkFaults(bandwidth_kbps=-1))
