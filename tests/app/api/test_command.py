"""`specwire api` on the command line: clear errors before anything loads, and a clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess

from tests.app.api.conftest import SPECWIRE, start_endpoint


def run_api(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([SPECWIRE, "api", *flags], capture_output=True, text=True, timeout=120)


def test_listening_beyond_this_machine_needs_a_token(tiny):
    """--host 0.0.0.0 without --api-token-file is refused, saying which flag to give."""
    done = run_api("--host", "0.0.0.0", "--draft", str(tiny.draft), "--offline")
    assert done.returncode == 2 and "--api-token-file" in done.stderr and "Traceback" not in done.stderr


def test_a_port_in_use_is_said_before_the_models_load(tiny):
    """A taken port: exit 2, naming the address and --port."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        done = run_api("--port", str(taken.getsockname()[1]), "--draft", str(tiny.draft), "--offline")
    finally:
        taken.close()
    assert done.returncode == 2 and "cannot listen on 127.0.0.1:" in done.stderr and "--port" in done.stderr


def test_bad_flags_are_named(tiny, tmp_path):
    """--drafters 0 with a model, a missing draft file: each is one clear line."""
    done = run_api("--drafters", "0", "--draft", str(tiny.draft), "--offline")
    assert done.returncode == 2 and "--draft ngram" in done.stderr
    done = run_api("--draft", str(tmp_path / "none.gguf"), "--offline")
    assert done.returncode == 2 and "no draft model at" in done.stderr


def test_offline_serves_the_drafter_alone_marked_and_sigterm_stops_it_cleanly(tiny):
    """--offline: replies are the drafter's, every token unverified; SIGTERM ends the process with status 0."""
    import openai

    endpoint = start_endpoint(tiny.draft, "--offline")
    answer = openai.OpenAI(base_url=endpoint.url, api_key="unused", max_retries=0).completions.create(
        model="specwire", prompt="def f(x):", max_tokens=10, temperature=0)
    assert answer.model_extra["specwire"]["provenance"] == [["offline", 10]]
    endpoint.process.send_signal(signal.SIGTERM)
    assert endpoint.process.wait(timeout=30) == 0
    assert "Traceback" not in endpoint.process.stderr.read()
