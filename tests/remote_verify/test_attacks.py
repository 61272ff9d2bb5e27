"""Attacks on a live service, each beside an honest session: what the honest client sees (its
worst round, its tokens) and what the service keeps (resident memory, log lines, metrics).

The service runs as `specwire serve -v` in a child process pinned to one CPU, as in the
fuzz test, so that its event loop, its memory and its log are its own.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from benchmarks.session_wave import TimedClient, pin_to_one_cpu, rss_bytes
from local_draft.speculator import Speculator
from wire.limits import MAX_STOP_IDS, ServiceLimits
from wire.protocol import (
    CLOSE_IDLE_TIMEOUT, SUBPROTOCOL, Error, Generate, Generated, SamplingParams, Sync, Welcome,
    decode_server_message, encode,
)
from tests.conftest import RunningService, hello_for

log = logging.getLogger(__name__)

SPECWIRE = str(Path(sys.executable).parent / "specwire")
MIB = 1024 * 1024
# The frame: typed decoding fails at `seq`, and the old reader decoded it again,
# untyped, on the event loop (~0.9 s: a million lists built and collected).
STALL_FRAME = msgspec.msgpack.encode({"type": "sync", "seq": "x", "tokens": [[]] * 1048000})
# A well-formed Sync of a million ids: the old service built it (8 MB), range-checked every
# id on the device thread, refused it by length, and kept it alive in a reference cycle.
MILLION_TOKEN_SYNC = encode(Sync(seq=1, tokens=[1] * 1040000))
STALL_MARGIN_S = 0.5  # the honest worst round under attack, over its worst without (old service: 1 to 4 s more)
IDLE_S = 0.2  # the idle timeout of the streaming test
MEMORY_MARGIN_MIB = 64  # resident memory after the attackers left, over the baseline (old service: +750 MiB)


class Service:
    """`specwire serve -v` in a child process, its log in a file."""

    def __init__(self, target: Path, log_file: Path, *options: str):
        self.log_file = log_file
        self.process = subprocess.Popen([SPECWIRE, "-v", "serve", "--target", str(target), "--port", "0", *options],
                                        stdout=subprocess.PIPE, stderr=log_file.open("w"), text=True,
                                        preexec_fn=pin_to_one_cpu)
        line = self.process.stdout.readline()
        assert line.startswith("listening on ws://"), line
        self.url = line.split()[-1]

    def rss_mib(self) -> float:
        return rss_bytes(self.process.pid) / MIB

    def sessions_open(self) -> float:
        with urllib.request.urlopen(self.url.replace("ws://", "http://") + "/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("specwire_sessions_open "):
                    return float(line.split()[1])
        raise KeyError("specwire_sessions_open")

    def close(self) -> str:
        self.process.terminate()
        self.process.wait(30)
        return self.log_file.read_text()


@pytest.fixture(scope="module")
def attacked(tiny, tmp_path_factory):
    service = Service(tiny.target_gguf, tmp_path_factory.mktemp("attacked") / "serve.log")
    yield service
    log = service.close()
    assert "Traceback" not in log, log[-4000:]


def hello_frame(draft) -> bytes:
    return encode(hello_for(draft))


def attack(url: str, hello: bytes, frame: bytes, stop: threading.Event, pipelined: int = 1,
           replies: list | None = None) -> None:
    """One attacking connection: `pipelined` frames at a time, each answered, until `stop`."""
    with connect(url, subprotocols=[SUBPROTOCOL], max_size=None) as ws:
        ws.send(hello)
        assert isinstance(decode_server_message(ws.recv(timeout=30)), Welcome)
        while not stop.is_set():
            for _ in range(pipelined):
                ws.send(frame)
            for _ in range(pipelined):
                reply = decode_server_message(ws.recv(timeout=60))
                if replies is not None:
                    replies.append(reply)
            if pipelined > 1:
                return


def honest_round_trips(url: str, draft, seconds: float) -> list[float]:
    """An honest session generating greedily for `seconds`: the round trip of each of its rounds."""
    client = TimedClient(url, hello_for(draft))
    try:
        speculator = Speculator(draft, client, SamplingParams(), k=4)
        prompt = draft.tokenize("def f(x):")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            speculator.generate(prompt, 32)
    finally:
        client.close()
    return [sample[0] for sample in client.samples]


def test_attacking_connections_do_not_stall_an_honest_session(attacked, close_draft):
    """Two connections sending the 1 MiB frame that took the old service ~0.9 s to refuse, over
    and over: the honest session's worst round stays within 500 ms of its worst without them,
    and the attackers' frames are refused (by shape, then by their own rate limit)."""
    quiet = honest_round_trips(attacked.url, close_draft, 2.0)
    stop, replies = threading.Event(), []
    attackers = [threading.Thread(target=attack, args=(attacked.url, hello_frame(close_draft), STALL_FRAME, stop),
                                  kwargs={"replies": replies}, daemon=True) for _ in range(2)]
    for attacker in attackers:
        attacker.start()
    time.sleep(0.5)  # the attackers are connected and sending
    try:
        under_attack = honest_round_trips(attacked.url, close_draft, 3.0)
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join(60)
    assert replies and all(isinstance(reply, Error) for reply in replies)
    assert {reply.code for reply in replies} <= {"bad_field", "rate_limited"}, {reply.code for reply in replies}
    assert max(under_attack) < max(quiet) + STALL_MARGIN_S, (max(quiet), max(under_attack), len(under_attack))
    assert len(under_attack) > len(quiet) / 2  # and about as many rounds in the time


def test_refused_pipelined_frames_leave_no_memory_behind(attacked, close_draft):
    """Eight connections each pipelining twelve million-token Syncs, all refused: once they
    have left, the service's resident memory is within 64 MiB of what it was before."""
    honest_round_trips(attacked.url, close_draft, 0.5)  # the allocator's first growth is not a leak
    before = attacked.rss_mib()
    stop, replies = threading.Event(), []
    attackers = [threading.Thread(target=attack, daemon=True,
                                  args=(attacked.url, hello_frame(close_draft), MILLION_TOKEN_SYNC, stop, 12, replies))
                 for _ in range(8)]
    for attacker in attackers:
        attacker.start()
    for attacker in attackers:
        attacker.join(120)
    deadline = time.monotonic() + 10
    while attacked.sessions_open() > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    after = attacked.rss_mib()
    assert len(replies) == 96 and all(isinstance(reply, Error) for reply in replies)
    assert after - before < MEMORY_MARGIN_MIB, (before, after)


FORGED = "2026-01-01 00:00:00,000 CRITICAL remote_verify.server: FORGED LINE"


def forge_log_lines(url: str, draft) -> None:
    """A client name, a vocabulary fingerprint and a message type, each carrying a log line of its own."""
    honest = hello_for(draft)
    for hello in (msgspec.structs.replace(honest, client="x\n" + FORGED),
                  msgspec.structs.replace(honest, vocab_fingerprint="ab\n" + FORGED)):
        with connect(url, subprotocols=[SUBPROTOCOL]) as ws:
            ws.send(encode(hello))
            decode_server_message(ws.recv(timeout=10))
    with connect(url, subprotocols=[SUBPROTOCOL]) as ws:
        ws.send(msgspec.msgpack.encode({"type": "x\n" + FORGED + "\r\x1b[2K"}))
        assert decode_server_message(ws.recv(timeout=10)).code == "bad_hello"


def test_client_strings_cannot_forge_text_log_lines(attacked, close_draft):
    """Newlines in the client's name, fingerprint and message type are escaped in the text log:
    no line of the log begins with the forged one, and the escaped text is there."""
    forge_log_lines(attacked.url, close_draft)
    time.sleep(0.2)
    log = attacked.log_file.read_text()
    assert not any(line.startswith(FORGED) for line in log.splitlines()), log[-2000:]
    assert "\x1b" not in log and "\r" not in log
    assert log.count("\\n" + FORGED[:20]) >= 3, log[-2000:]  # the fingerprint is quoted cut to 32 characters


def test_client_strings_cannot_forge_json_log_lines(tiny, close_draft, tmp_path):
    """The same in the JSON log: every line is one JSON object, and none is the forged one."""
    service = Service(tiny.target_gguf, tmp_path / "serve.log", "--log-format", "json")
    try:
        forge_log_lines(service.url, close_draft)
        time.sleep(0.2)
    finally:
        log = service.close()
    entries = [json.loads(line) for line in log.splitlines()]
    assert not any(entry["message"].startswith(FORGED) for entry in entries)
    assert sum("\\n" + FORGED[:20] in entry["message"] for entry in entries) >= 3


def test_two_authorization_headers_get_400_and_are_counted(own_llamacpp_target, caplog):
    """An upgrade with two Authorization headers is answered 400 saying so, counted as a refusal,
    and logs no error (it was a 500 with a traceback)."""
    running = RunningService(own_llamacpp_target, token="s3cret")
    try:
        host, port = running.url.removeprefix("ws://").split(":")
        request = (f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n"
                   "Authorization: Bearer s3cret\r\nAuthorization: Bearer other\r\n\r\n")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(request.encode())
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"\n"):
                chunk = raw.recv(4096)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b"2 Authorization headers" in answer
        scrape = urllib.request.Request(running.url.replace("ws://", "http://") + "/metrics",
                                        headers={"Authorization": "Bearer s3cret"})  # behind the token
        with urllib.request.urlopen(scrape, timeout=5) as metrics:
            assert 'specwire_refusals_total{reason="bad_request"} 1.0' in metrics.read().decode()
    finally:
        running.close()
    assert not [record for record in caplog.records if record.levelname in ("ERROR", "CRITICAL")]


def test_a_long_stream_is_not_cut_by_the_idle_timeout(own_llamacpp_target, close_draft):
    """A server-only stream that lasts several times the idle timeout, its client sending
    nothing meanwhile, ends with its last frame, not a 4408 close; a silent session still
    is closed after the timeout."""
    running = RunningService(own_llamacpp_target, service_limits=ServiceLimits(idle_timeout_s=IDLE_S))
    try:
        with connect(running.url, subprotocols=[SUBPROTOCOL]) as ws:
            ws.send(encode(hello_for(close_draft)))
            assert isinstance(decode_server_message(ws.recv(timeout=10)), Welcome)
            ws.send(encode(Generate(seq=1, committed_len=0, append=[1], max_tokens=4000)))  # 2.6 s on the CI machine
            started, frames = time.monotonic(), []
            while not (frames and frames[-1].done):
                frames.append(decode_server_message(ws.recv(timeout=10)))
                assert isinstance(frames[-1], Generated), frames[-1]
            lasted = time.monotonic() - started
            log.info("a stream of %d tokens lasted %.2f s", sum(len(f.tokens) for f in frames), lasted)
            assert frames[-1].stop_reason in ("max_tokens", "context") and lasted > 3 * IDLE_S, lasted
            with pytest.raises(ConnectionClosed) as closed:  # now silent both ways
                ws.recv(timeout=5)
            assert closed.value.rcvd.code == CLOSE_IDLE_TIMEOUT
    finally:
        running.close()


def test_stop_ids_are_bounded_and_repeats_cost_nothing(service_on, close_draft):
    """A Generate with more stop ids than the bound is refused with a message naming it;
    the bound's worth of one repeated id is taken, and the stream stops at that id."""
    running = service_on("llamacpp")
    with connect(running.url, subprotocols=[SUBPROTOCOL]) as ws:
        ws.send(encode(hello_for(close_draft)))
        assert isinstance(decode_server_message(ws.recv(timeout=10)), Welcome)
        ws.send(encode(Generate(seq=1, committed_len=0, append=[1], stop_ids=[2] * (MAX_STOP_IDS + 1))))
        reply = decode_server_message(ws.recv(timeout=10))
        assert isinstance(reply, Error) and reply.code == "bad_request" and str(MAX_STOP_IDS) in reply.message
        ws.send(encode(Generate(seq=1, committed_len=0, append=[1], max_tokens=8)))
        first = []
        while not (first and first[-1].done):
            first.append(decode_server_message(ws.recv(timeout=10)))
        stop_at = first[0].tokens[0]  # the target's first token: a stop id repeated MAX_STOP_IDS times
        ws.send(encode(Sync(seq=2, tokens=[1])))
        decode_server_message(ws.recv(timeout=10))
        ws.send(encode(Generate(seq=3, committed_len=1, max_tokens=8, stop_ids=[stop_at] * MAX_STOP_IDS)))
        stopped = decode_server_message(ws.recv(timeout=10))
        assert stopped.tokens == [stop_at] and stopped.done and stopped.stop_reason == "eos"
