"""Admission per client: a client address may hold so many sessions and open so many a second;
loopback clients are exempt unless the service says otherwise (real services on port 0)."""

from __future__ import annotations

import pytest

from local_draft.verify_client import ServiceBusy, VerifyClient
from tests.conftest import RunningService, hello_for
from wire.limits import ServiceLimits


def test_one_client_cannot_hold_every_session(own_llamacpp_target, close_draft):
    """--max-sessions 6: one client gets half (3); the fourth is refused (HTTP 429, a retry hint and
    the flag named) while the service still has room for others; closing one lets it in again."""
    running = RunningService(own_llamacpp_target, service_limits=ServiceLimits(max_sessions=6, limit_loopback=True))
    clients = []
    try:
        clients = [VerifyClient(running.url, hello_for(close_draft)) for _ in range(3)]
        with pytest.raises(ServiceBusy) as refused:
            VerifyClient(running.url, hello_for(close_draft))
        assert "HTTP 429" in str(refused.value) and "--max-sessions-per-client 3" in str(refused.value)
        assert refused.value.retry_after_s == 5.0
        clients.pop().close()
        clients.append(VerifyClient(running.url, hello_for(close_draft)))
    finally:
        for client in clients:
            client.close()
        running.close()


def test_one_client_cannot_open_sessions_faster_than_its_rate(own_llamacpp_target, close_draft):
    """A burst of 3, then 1 a second: the fourth session opened at once is refused with how long to wait."""
    limits = ServiceLimits(handshake_rate_per_s=1.0, handshake_burst=3, limit_loopback=True)
    running = RunningService(own_llamacpp_target, service_limits=limits)
    try:
        for _ in range(3):
            VerifyClient(running.url, hello_for(close_draft)).close()
        with pytest.raises(ServiceBusy) as refused:
            VerifyClient(running.url, hello_for(close_draft))
        assert "more than 1 new sessions a second from this client" in str(refused.value)
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
    finally:
        running.close()


def test_clients_on_this_machine_are_not_limited_per_client_by_default(own_llamacpp_target, close_draft):
    """The chat, the benchmarks and the tests connect from loopback: seven sessions of eight, opened
    at once, are all taken."""
    running = RunningService(own_llamacpp_target, service_limits=ServiceLimits(max_sessions=8, handshake_burst=2))
    clients = []
    try:
        clients = [VerifyClient(running.url, hello_for(close_draft)) for _ in range(7)]
    finally:
        for client in clients:
            client.close()
        running.close()
    assert len(clients) == 7
