"""Losing the service mid-reply: the reply goes on offline, marked, and verification resumes
on a restarted service, rebuilt from the client's history, with parity intact."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from local_draft.service_link import Backoff, ServiceLink
from local_draft.speculator import Speculator
from wire.protocol import SamplingParams
from tests.conftest import hello_for

SPECWIRE = str(Path(sys.executable).parent / "specwire")
FAST_BACKOFF = Backoff(first_s=0.05, max_s=0.3)


def start_service(target: Path, port: int = 0) -> tuple[subprocess.Popen, int]:
    """`specwire serve` in a child process (so that it can be SIGKILLed); returns it and its port.
    The tests give it the tiny target's GGUF, served by llama.cpp as on any CPU: it is listening
    within a second or two, where the same target on torch spends several importing torch."""
    process = subprocess.Popen([SPECWIRE, "serve", "--target", str(target), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    assert line.startswith("listening on ws://127.0.0.1:"), line
    return process, int(line.rsplit(":", 1)[1])


def target_alone(target, context: list[int], n: int) -> list[int]:
    """Greedy continuation by the target backend itself, one token at a time."""
    cache, tokens = target.new_cache(), []
    logits = target.forward(cache, context, 1)
    for _ in range(n):
        tokens.append(int(logits[-1].argmax()))
        logits = target.forward(cache, tokens[-1:], 1)
    return tokens


def wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_losing_the_service_mid_reply_goes_offline_then_a_restart_is_verified_again(
        tiny, llamacpp_target, close_draft, stop_signal):
    """SIGKILL (or SIGTERM: a clean going-away close) after 20 tokens: offline tokens follow,
    marked; after a restart on the same port the link reconnects, the service rebuilds the
    session, and greedy parity holds again."""
    process, port = start_service(tiny.target_gguf)
    states = []
    link = ServiceLink(f"ws://127.0.0.1:{port}", hello_for(close_draft), on_state=states.append,
                       backoff=FAST_BACKOFF)
    marks: list[str] = []

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        nonlocal process
        marks.extend(provenance)
        if len(marks) >= 20 and process.poll() is None and "offline" not in marks:
            process.send_signal(stop_signal)
            process.wait()
        elif marks.count("offline") >= 10 and process.poll() is not None:
            process, _ = start_service(tiny.target_gguf, port)  # the same address, a new session
            assert wait_for(lambda: link.connected), "the link did not reconnect"

    prompt = close_draft.tokenize("def quicksort(arr):")
    try:
        result = Speculator(close_draft, link, SamplingParams(), k=4).generate(prompt, 120, on_commit)
    finally:
        link.close()
        process.kill()

    assert len(result.token_ids) == 120 and result.stop_reason == "max_tokens"
    first_offline = marks.index("offline")
    last_offline = len(marks) - 1 - marks[::-1].index("offline")
    assert first_offline >= 20 and last_offline - first_offline + 1 >= 10
    assert set(marks[last_offline + 1:]) <= {"draft", "target"} and len(marks) - last_offline > 20
    assert result.stats.offline == marks.count("offline")
    assert link.connections == 2
    assert any(not s.connected for s in states) and states[-1].connected

    # before the kill: the target's own tokens; after the restart: the target's continuation
    # of everything committed so far, offline tokens included
    ids = result.token_ids
    assert ids[:first_offline] == target_alone(llamacpp_target, prompt, first_offline)
    resumed = last_offline + 1
    assert ids[resumed:] == target_alone(llamacpp_target, prompt + ids[:resumed], len(ids) - resumed)


def test_a_stalled_service_times_out_into_offline_and_is_used_again_when_it_wakes(tiny, close_draft):
    """SIGSTOP freezes the service with its socket open: the round times out, the reply goes
    on offline, and after SIGCONT the link reconnects and rounds are verified again."""
    process, port = start_service(tiny.target_gguf)
    link = ServiceLink(f"ws://127.0.0.1:{port}", hello_for(close_draft), backoff=FAST_BACKOFF,
                       stall_timeout_s=0.5)
    marks: list[str] = []

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        marks.extend(provenance)
        if len(marks) >= 20 and "offline" not in marks:
            process.send_signal(signal.SIGSTOP)
        elif marks.count("offline") == 10:
            process.send_signal(signal.SIGCONT)
            assert wait_for(lambda: link.connected), "the link did not come back"

    try:
        result = Speculator(close_draft, link, SamplingParams(), k=4).generate(
            close_draft.tokenize("import numpy"), 80, on_commit)
    finally:
        link.close()
        process.send_signal(signal.SIGCONT)
        process.kill()
    assert len(result.token_ids) == 80 and marks.count("offline") >= 10
    after = marks[len(marks) - 1 - marks[::-1].index("offline") + 1:]
    assert after and set(after) <= {"draft", "target"}


def test_generate_finishes_a_reply_offline_when_the_service_is_killed(tiny, close_draft):
    """`specwire generate`: kill -9 of the service once text streams; the reply is complete, the
    notice is on stderr (that the reply waits 3 s for another replica first) and the summary
    counts the unverified tokens."""
    process, port = start_service(tiny.target_gguf)
    try:
        generate = subprocess.Popen(
            [SPECWIRE, "generate", "--draft", str(tiny.draft), "--server", f"ws://127.0.0.1:{port}",
             "--prompt", "def f(x):", "--max-tokens", "1000", "--temperature", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        generate.stdout.read(1)  # the first streamed byte: the reply is under way
        process.kill()
        out, err = generate.communicate(timeout=120)
    finally:
        process.kill()
    err = err.decode()
    assert generate.returncode == 0, err
    assert "lost the service" in err and "reconnecting, continuing offline if no service takes over within 3 s" in err
    assert "stopped at max_tokens: 1000 tokens" in err
    assert " unverified (offline)" in err and "Traceback" not in err


def test_a_refused_reconnect_stops_retrying(tiny, close_draft, tmp_path):
    """A service that comes back demanding a token: the link says so and gives up, offline stays."""
    process, port = start_service(tiny.target_gguf)
    states = []
    link = ServiceLink(f"ws://127.0.0.1:{port}", hello_for(close_draft), on_state=states.append,
                       backoff=FAST_BACKOFF)
    process.kill()
    process.wait()
    link.lost("killed by the test")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret")
    token_file.chmod(0o600)
    guarded = subprocess.Popen([SPECWIRE, "serve", "--target", str(tiny.target_gguf), "--port", str(port),
                                "--token-file", str(token_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert guarded.stdout.readline().startswith("listening on")
        assert wait_for(lambda: states and "refused" in states[-1].detail)
        assert not link.connected and "401" in states[-1].detail
    finally:
        link.close()
        guarded.kill()


def _seeded_sampled_reply(tiny, draft, process: subprocess.Popen, port: int,
                          restart_after: int | None) -> tuple[list[int], ServiceLink]:
    """A seeded sampled reply (seed 7, temperature 1, k = 3, no drafting ahead); with `restart_after`,
    the service is SIGKILLed once that many tokens are committed and a new one (another process:
    any replica) is started on the same port before the next round, which rebuilds the session."""
    params = SamplingParams(temperature=1.0)
    link = ServiceLink(f"ws://127.0.0.1:{port}", hello_for(draft, params, seed=7), backoff=FAST_BACKOFF)
    made: list[int] = []

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        nonlocal process
        made.extend(tokens)
        if restart_after is not None and len(made) >= restart_after and link.connections == 1:
            process.kill()
            process.wait()
            process, _ = start_service(tiny.target_gguf, port)
            assert wait_for(lambda: link.current() is not None and link.connections == 2), "no reconnect"

    try:
        result = Speculator(draft, link, params, k=3, seed=7).generate(draft.tokenize("The"), 60, on_commit)
    finally:
        link.close()
        process.kill()
        process.wait()  # the port is free for the next run
    assert result.stats.offline == 0
    return result.token_ids, link


def test_a_seeded_sampled_reply_repeats_through_a_killed_and_restarted_service(tiny, close_draft):
    """The same seed gives the same sampled tokens whether or not the service is killed and
    replaced mid-reply: the new session draws position n's numbers from (seed, n), as the old did."""
    process, port = start_service(tiny.target_gguf)
    straight, _ = _seeded_sampled_reply(tiny, close_draft, process, port, restart_after=None)
    process, _ = start_service(tiny.target_gguf, port)
    interrupted, link = _seeded_sampled_reply(tiny, close_draft, process, port, restart_after=20)
    assert link.connections == 2
    assert interrupted == straight and len(straight) >= 20

