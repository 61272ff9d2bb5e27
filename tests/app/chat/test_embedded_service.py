"""The embedded service: a real `specwire serve` child that is restarted if it dies and never outlives the chat."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from app.chat.embedded_service import EmbeddedService, EmbeddedServiceError
from tests.app.chat.conftest import wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose: its parent has not reaped it yet
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_killed_service_is_restarted_on_the_same_port_and_stops_for_good_on_stop(tiny):
    """SIGKILL: the chat is told, and a new child listens at the same URL; stop() ends it."""
    events = []
    service = EmbeddedService(str(tiny.target_gguf), "llamacpp", on_event=lambda text, up: events.append((text, up)))
    url = service.start()
    first = service.process.pid
    try:
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: events and events[-1][1], 60, "the restart")
        assert "killed by SIGKILL" in events[0][0] and "restarting" in events[0][0]
        assert service.url == url and service.process.pid != first and service.running
    finally:
        service.stop()
    assert service.process.poll() is not None and not service.running


def test_a_service_that_cannot_start_says_why(tmp_path):
    """A missing target: the error carries the service's own message, not a traceback."""
    service = EmbeddedService(str(tmp_path / "missing.gguf"), "llamacpp")
    with pytest.raises(EmbeddedServiceError, match="stopped before it was ready") as failure:
        service.start(timeout_s=120)
    assert "missing.gguf" in str(failure.value) and "Traceback" not in str(failure.value)


def test_the_service_stops_when_the_chat_process_is_killed(tiny):
    """The parent SIGKILLs itself: the child sees its stdin pipe close and stops (no orphan)."""
    parent = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from app.chat.embedded_service import EmbeddedService
        service = EmbeddedService({str(tiny.target_gguf)!r}, "llamacpp")
        service.start()
        print(service.process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """)], capture_output=True, text=True, timeout=120)
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    child = int(parent.stdout.split()[0])
    wait_until(lambda: not _alive(child), 20, "the orphaned service to stop")


def test_the_embedded_service_serves_its_chat_only(tiny, close_draft):
    """Its token is random, never on its command line, and the same after a restart: a client
    without it is refused (HTTP 401); the chat's client, with it, gets the service's proof."""
    from local_draft.verify_client import VerifyClient, VerifyError
    from tests.conftest import hello_for

    service = EmbeddedService(str(tiny.target_gguf), "llamacpp")
    url = service.start()
    try:
        assert len(service.token) >= 32 and service.token not in " ".join(service.command())
        with open(f"/proc/{service.process.pid}/cmdline", "rb") as cmdline:
            assert service.token.encode() not in cmdline.read()
        with pytest.raises(VerifyError) as refused:
            VerifyClient(url, hello_for(close_draft))
        assert refused.value.code == "http_401"
        VerifyClient(url, hello_for(close_draft), token=service.token, prove_service=True).close()
        token, first = service.token, service.process.pid
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: service.process.pid != first and service.running and service.url == url, 60, "the restart")
        assert service.token == token
        VerifyClient(url, hello_for(close_draft), token=token, prove_service=True).close()
    finally:
        service.stop()


def test_a_program_that_takes_the_port_while_the_service_is_down_hears_nothing(chat_settings, tiny):
    """The chat's service dies and another program listens on its port before the restart: the chat's
    reconnects refuse it (it cannot prove it holds the token) and it never receives a Hello, let alone
    the conversation's Sync; the reply goes on offline."""
    import socket
    import time

    from app.chat.engine import ChatEngine
    from tests.app.chat.test_engine import Recorder
    from tests.fake_service import FakeService, honest_answer

    engine = ChatEngine(chat_settings(restart_service=False, max_tokens=8), Recorder())
    impostor = None
    try:
        engine.start()
        engine.reply("my secret plan", lambda: False)
        service = engine.connection_to.service
        port = service.port
        service.process.kill()
        service.process.wait()
        impostor = FakeService(honest_answer(), port=port)
        engine.link.lost("the test killed the service")
        wait_until(lambda: impostor.connections > 0, 30, "a reconnect to reach the impostor")
        time.sleep(0.5)
        outcome = engine.reply("and the next step", lambda: False)
    finally:
        engine.close()
        if impostor is not None:
            impostor.close()
    assert impostor.sessions == [] and impostor.connections >= 1  # connected, refused, no Hello
    assert outcome.stop_reason in ("max_tokens", "eos")
