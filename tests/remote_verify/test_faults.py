"""Faults on the service side: a client vanishing mid-round, and a drain on shutdown.

A round must be in flight while the fault happens, so these tests verify with the real tiny
target behind a delay (`SlowTarget`): a stand-in for a large model's forward pass, which the
tiny one is far too fast to leave time for.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from wire.protocol import (
    CLOSE_GOING_AWAY, SUBPROTOCOL, Verdict, Verify, Welcome, decode_server_message, encode,
)
from tests.conftest import RunningService, hello_for

FORWARD_DELAY_S = 0.6


class SlowTarget:
    """The real target, with every forward pass taking FORWARD_DELAY_S longer once the service is
    up (its start-up passes, which time the cost curve, run at the target's own speed, uncounted)."""

    def __init__(self, target):
        self._target = target
        self.forwards = 0
        self.armed = False

    def __getattr__(self, name):
        return getattr(self._target, name)

    def _slow(self) -> None:
        if self.armed:
            time.sleep(FORWARD_DELAY_S)
            self.forwards += 1

    def forward(self, cache, tokens, n_logits):
        self._slow()
        return self._target.forward(cache, tokens, n_logits)

    def forward_many(self, passes):  # the service's path: its rounds may share a pass
        self._slow()
        return self._target.forward_many(passes)


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def open_session(url: str, draft):
    ws = connect(url, subprotocols=[SUBPROTOCOL]).__enter__()
    ws.send(encode(hello_for(draft)))
    assert isinstance(decode_server_message(ws.recv()), Welcome)
    return ws


def test_a_client_that_vanishes_mid_round_frees_its_session(own_llamacpp_target, close_draft):
    """The TCP connection drops while the round is queued or runs: the round runs at most once (not
    at all if it had not started: nobody is waiting for it), the session and its cache are freed,
    and the next client is served."""
    slow = SlowTarget(own_llamacpp_target)
    running = RunningService(slow)
    slow.armed = True
    try:
        ws = open_session(running.url, close_draft)
        assert len(running.service.sessions) == 1
        ws.send(encode(Verify(seq=1, committed_len=0, append=[1, 2, 3], draft=[4, 5])))
        assert wait_for(lambda: running.service._busy), "the round did not start"
        ws.socket.shutdown(socket.SHUT_RDWR)  # gone without a close handshake
        ws.socket.close()
        assert wait_for(lambda: not running.service.sessions), "the vanished session was kept"
        assert slow.forwards <= 1
        with connect(running.url, subprotocols=[SUBPROTOCOL]) as other:
            other.send(encode(hello_for(close_draft)))
            decode_server_message(other.recv())
            other.send(encode(Verify(seq=1, committed_len=0, append=[1, 2])))
            assert isinstance(decode_server_message(other.recv(timeout=10)), Verdict)
    finally:
        running.close()


def test_shutdown_finishes_rounds_in_flight_then_says_going_away(own_llamacpp_target, close_draft):
    """stop() (what SIGTERM calls): /healthz turns 503 "draining", new sessions get 503, an idle
    session is closed with 1001 at once, and a session mid-round gets its verdict first, then 1001."""
    slow = SlowTarget(own_llamacpp_target)
    running = RunningService(slow)
    slow.armed = True
    health = running.url.replace("ws://", "http://") + "/healthz"
    idle = open_session(running.url, close_draft)
    busy = open_session(running.url, close_draft)
    busy.send(encode(Verify(seq=1, committed_len=0, append=[1, 2, 3], draft=[4])))
    assert wait_for(lambda: running.service._busy), "the round did not start"
    stopper = threading.Thread(target=running.close)
    stopper.start()
    try:
        assert wait_for(lambda: running.service.state == "draining")
        with pytest.raises(ConnectionClosed) as idle_closed:
            idle.recv(timeout=5)
        assert idle_closed.value.rcvd.code == CLOSE_GOING_AWAY
        with pytest.raises(urllib.error.HTTPError) as draining:
            urllib.request.urlopen(health, timeout=5)
        assert draining.value.code == 503 and draining.value.read() == b"draining\n"
        with pytest.raises(InvalidStatus) as refused:
            connect(running.url, subprotocols=[SUBPROTOCOL])
        assert refused.value.response.status_code == 503 and b"shutting down" in refused.value.response.body

        verdict = decode_server_message(busy.recv(timeout=10))  # the round in flight is answered
        assert isinstance(verdict, Verdict) and verdict.seq == 1
        with pytest.raises(ConnectionClosed) as busy_closed:
            busy.recv(timeout=5)
        assert busy_closed.value.rcvd.code == CLOSE_GOING_AWAY
    finally:
        stopper.join(30)
        idle.close()
        busy.close()
    assert not running.thread.is_alive()


def test_a_stop_while_the_target_loads_ends_the_service_at_once(own_llamacpp_target):
    """SIGTERM during a long model load stops the service without waiting for the load."""
    import asyncio

    from remote_verify.server import ServiceConfig, VerifyService

    release = threading.Event()
    service = VerifyService(lambda: release.wait(60) and own_llamacpp_target, ServiceConfig(port=0))
    ready = []
    thread = threading.Thread(target=lambda: asyncio.run(service.run(ready.append, handle_signals=False)),
                              daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: service.port is not None)
        started = time.monotonic()
        service.stop()
        thread.join(10)
        assert not thread.is_alive() and time.monotonic() - started < 5 and ready == []
    finally:
        release.set()


def test_a_drain_does_not_wait_long_for_a_client_that_stopped_answering(own_llamacpp_target, close_draft):
    """An idle session whose client's link stalled (no byte moves either way, nothing closed) when
    the service drains: its 1001 is never acknowledged, and the service ends within the close
    timeout (CLOSE_TIMEOUT_S) instead of websockets' 10 s default, per such connection. (A SIGTERM
    drain took 4 to 22 s in the soak, behind a link that stalls.)"""
    from app.latency_proxy import LatencyProxy
    from remote_verify.server import CLOSE_TIMEOUT_S

    running = RunningService(own_llamacpp_target)
    proxy = LatencyProxy(running.url)
    url = proxy.start_in_thread()
    stalled = open_session(url, close_draft)
    try:
        assert wait_for(lambda: len(running.service.sessions) == 1)
        proxy.stall_all(60)
        time.sleep(0.2)  # the stall is in place (the proxy's own loop)
        started = time.monotonic()
        running.close()
        took = time.monotonic() - started
    finally:
        proxy.stop()
        stalled.socket.close()
    assert not running.thread.is_alive()
    assert took < CLOSE_TIMEOUT_S + 2.0, took
