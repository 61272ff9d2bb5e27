"""Replicas of the service behind a real HAProxy run with packaging/haproxy/haproxy.cfg: the
replica serving a reply is killed (SIGKILL) or stopped (SIGTERM, a drain) mid-reply; the client
reconnects through HAProxy, lands on the other replica, rebuilds its session from its own
history, and the reply is the target's alone (greedy), with no offline token. Each replica is
the service on an emulated GPU (benchmarks/replica_pool.py `pace`), its passes paced like a large
target's, so the stop lands in the middle of the reply on any machine.

HAProxy must be installed (`bash packaging/install.sh --dev` installs it): without it these tests
fail, saying so; they never skip.
"""

from __future__ import annotations

import signal

import pytest

from benchmarks.replica_pool import ReplicaPool, haproxy_config, sessions_open
from local_draft.service_link import ServiceLink
from local_draft.speculator import Speculator
from local_draft.stream_speculator import StreamSpeculator
from wire.protocol import SamplingParams
from tests.conftest import hello_for
from tests.local_draft.test_fallback import FAST_BACKOFF, target_alone, wait_for

TOKENS = 60
STOP_AFTER = 12
# Each replica's passes held to a 70B-class target's, three times over (about 56 ms a pass): the
# tiny target alone streams a whole reply in milliseconds, before a stop could cut it.
PACE = ("h100x2-70b-fp8", 3.0)


STOPS = [("default", signal.SIGKILL), ("default", signal.SIGTERM), ("rounds", signal.SIGKILL)]


@pytest.fixture(scope="module")
def pool(tiny, tmp_path_factory):
    """A replica per case and one more: each case stops the one serving its reply, and at least two
    are left for the next."""
    with ReplicaPool(tiny.target_gguf, len(STOPS) + 1, tmp_path_factory.mktemp("replicas"), pace=PACE) as running:
        yield running


def serving(pool: ReplicaPool) -> list[int]:
    """The indexes of the replicas holding a session now."""
    return [i for i, replica in enumerate(pool.replicas) if sessions_open(replica.port) > 0]


@pytest.mark.parametrize("mode, stop_signal", STOPS, ids=["kill", "term", "rounds-kill"])
def test_a_reply_survives_its_replica_dying_behind_haproxy(pool, close_draft, llamacpp_target, mode, stop_signal):
    """The link's takeover wait (as `specwire generate --server` sets it): the reply, in the
    default mode or in rounds, waits for another replica instead of going on offline."""
    link = ServiceLink(pool.url, hello_for(close_draft), backoff=FAST_BACKOFF, takeover_wait_s=10)
    stopped: list[int] = []
    marks: list[str] = []

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        marks.extend(provenance)
        if len(marks) >= STOP_AFTER and not stopped:
            holders = serving(pool)
            assert len(holders) == 1, f"the session should be on one replica, found {holders}"
            stopped.append(holders[0])
            pool.replicas[holders[0]].stop(stop_signal, wait=False)  # a drain goes on while the reply does

    prompt = close_draft.tokenize("def quicksort(arr):")
    try:
        if mode == "rounds":
            generator = Speculator(close_draft, link, SamplingParams(), k=4)
        else:
            generator = StreamSpeculator(close_draft, link, SamplingParams(), max_block=4)
        result = generator.generate(prompt, TOKENS, on_commit)
    finally:
        link.close()
    assert stopped, "the reply ended before a replica could be stopped"
    assert "offline" not in marks, marks  # the other replica took the session over in time
    assert link.connections == 2  # one reconnect, through HAProxy, to a replica left
    assert pool.replicas[stopped[0]].process.wait(timeout=60) is not None  # the stopped one did end
    assert result.token_ids == target_alone(llamacpp_target, prompt, TOKENS)


def test_the_packaged_config_is_used_with_this_machines_ports():
    """Only the bind and server lines change: balance, checks and retries are the packaged ones."""
    text = haproxy_config(9000, [9001, 9002, 9003])
    assert "bind 127.0.0.1:9000" in text and text.count("    server replica") == 3
    for kept in ("balance leastconn", "uri /healthz", "option redispatch", "retry-on conn-failure"):
        assert kept in text


def test_a_missing_haproxy_fails_saying_how_to_install_it(monkeypatch, tiny):
    """No haproxy on PATH nor in /usr/sbin: the pool refuses to start, naming the install command
    (the tests above then fail with it: they never skip)."""
    import benchmarks.replica_pool as replica_pool

    monkeypatch.setattr(replica_pool.shutil, "which", lambda name: None)
    monkeypatch.setattr(replica_pool.os, "access", lambda path, mode: False)
    with pytest.raises(RuntimeError, match=r"apt-get install haproxy.*install\.sh --dev"):
        ReplicaPool(tiny.target_gguf, 2)
