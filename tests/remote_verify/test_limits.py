"""Each limit refuses one request or connection with a clear message and a retry hint,
and the service goes on serving."""

from __future__ import annotations

import contextlib
import time
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from local_draft.service_link import ServiceLink
from local_draft.speculator import Speculator
from local_draft.verify_client import ServiceBusy, VerifyClient
from remote_verify.limits import TokenBucket
from wire.limits import ServiceLimits
from wire.protocol import (
    CLOSE_IDLE_TIMEOUT, SUBPROTOCOL, SamplingParams, Verdict, Verify, Welcome, decode_server_message, encode,
)
from remote_verify.session import SessionLimits
from tests.conftest import RunningService, hello_for


def test_the_token_bucket_allows_a_burst_then_the_rate():
    """Burst of 3 at 2/s: three at once, the fourth waits 0.5 s, and after 0.5 s one more is allowed."""
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.take() == 0.0 and bucket.take() == pytest.approx(0.5)
    now[0] = 100.0
    assert [bucket.take() for _ in range(4)][-1] > 0  # refills only up to the burst


def test_limits_that_cannot_work_are_named():
    """A zero session limit or a negative rate is refused with the flag's name."""
    problems = ServiceLimits(max_sessions=0, rate_per_s=-1).problems()
    assert any("--max-sessions" in p for p in problems) and any("--rate " in p for p in problems)
    assert ServiceLimits().problems() == []


@pytest.fixture(scope="module")
def limited(new_llamacpp_target):
    running = RunningService(new_llamacpp_target(), limits=SessionLimits(max_draft=8, max_context=64),
                             service_limits=ServiceLimits(max_sessions=2, rate_per_s=4, rate_burst=5,
                                                          max_frame_bytes=8192, retry_after_s=3))
    yield running
    running.close()


@contextlib.contextmanager
def _session(url: str, draft):
    """A bare WebSocket session past its Welcome."""
    with connect(url, subprotocols=[SUBPROTOCOL]) as ws:
        ws.send(encode(hello_for(draft)))
        assert isinstance(decode_server_message(ws.recv()), Welcome)
        yield ws


def test_sessions_over_the_limit_get_503_with_retry_after(limited, close_draft):
    """A third session on a two-session service is refused at the upgrade: 503, Retry-After, why."""
    with _session(limited.url, close_draft), _session(limited.url, close_draft):
        with pytest.raises(InvalidStatus) as refused:
            connect(limited.url, subprotocols=[SUBPROTOCOL])
        response = refused.value.response
        assert response.status_code == 503 and response.headers["Retry-After"] == "3"
        assert b"limit of 2 sessions" in response.body
        with pytest.raises(ServiceBusy) as busy:  # the client's view: retryable, with the hint
            VerifyClient(limited.url, hello_for(close_draft))
        assert busy.value.retry_after_s == 3.0
    deadline = time.monotonic() + 5
    while limited.service.sessions and time.monotonic() < deadline:
        time.sleep(0.02)
    VerifyClient(limited.url, hello_for(close_draft)).close()  # room again


def test_too_many_requests_get_an_error_with_a_retry_hint(limited, close_draft):
    """Six frames at once on a 4/s, burst 5 connection: the sixth is refused with retry_after_s,
    not run; after waiting, the connection works again."""
    with _session(limited.url, close_draft) as ws:
        for _ in range(6):
            ws.send(encode(Verify(seq=99, committed_len=0, append=[1])))  # bad_seq: cheap and not fatal
        replies = [decode_server_message(ws.recv()) for _ in range(6)]
        assert [r.code for r in replies[:5]] == ["bad_seq"] * 5
        assert replies[5].code == "rate_limited" and 0 < replies[5].retry_after_s <= 0.25
        assert "4 requests a second" in replies[5].message and not replies[5].fatal
        time.sleep(replies[5].retry_after_s)
        ws.send(encode(Verify(seq=1, committed_len=0, append=[1, 2], draft=[3])))
        assert isinstance(decode_server_message(ws.recv()), Verdict)


def test_the_client_waits_out_a_rate_limit(limited, close_draft):
    """VerifyClient resends a rate-limited request after the hint: 12 rounds at 4/s all verified."""
    client = VerifyClient(limited.url, hello_for(close_draft))
    try:
        verdicts, committed = [], 0
        for seq in range(1, 13):
            verdict = client.verify(Verify(seq=seq, committed_len=committed, append=[1] if seq == 1 else []))
            committed = verdict.committed_len
            verdicts.append(verdict)
        assert len(verdicts) == 12 and committed == 13
    finally:
        client.close()


def test_limits_on_draft_context_and_frame_size(limited, close_draft):
    """A draft over the limit and a history over the context get errors naming the limit; an
    oversized frame closes that connection with 1009; the service still serves."""
    with _session(limited.url, close_draft) as ws:
        ws.send(encode(Verify(seq=1, committed_len=0, append=[1], draft=[2] * 9)))
        reply = decode_server_message(ws.recv())
        assert reply.code == "draft_too_long" and "limit of 8" in reply.message
        ws.send(encode(Verify(seq=1, committed_len=0, append=[1] * 70)))
        reply = decode_server_message(ws.recv())
        assert reply.code == "context_full" and "context limit of 64" in reply.message
        ws.send(encode(Verify(seq=1, committed_len=0, append=[300] * 5000)))  # 15 kB > 8192 bytes
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
        assert closed.value.rcvd.code == 1009
    with urllib.request.urlopen(limited.url.replace("ws://", "http://") + "/healthz", timeout=5) as health:
        assert health.status == 200


@pytest.fixture(scope="module")
def impatient(new_llamacpp_target):
    running = RunningService(new_llamacpp_target(), service_limits=ServiceLimits(idle_timeout_s=1.0))
    yield running
    running.close()


def test_an_idle_session_is_closed_and_the_link_opens_a_new_one(impatient, close_draft):
    """A session silent past the idle timeout is closed with 4408; the client's next reply opens a
    new session at once and is verified, with no offline token."""
    with _session(impatient.url, close_draft) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd.code == CLOSE_IDLE_TIMEOUT and "idle" in closed.value.rcvd.reason

    link = ServiceLink(impatient.url, hello_for(close_draft))
    try:
        speculator = Speculator(close_draft, link, SamplingParams(), k=2)
        prompt = close_draft.tokenize("def f(x):")
        first = speculator.generate(prompt, 4)
        time.sleep(1.5)  # the service closes the session meanwhile
        second = speculator.generate(prompt + first.token_ids, 4)
        assert link.connections == 2 and second.stats.offline == 0 and second.stats.rounds >= 1
    finally:
        link.close()
