"""The client trusts nothing a service sends: ids out of the vocabulary end the reply with an error
naming the service (not an abort inside llama.cpp), and every word a service says is escaped.

The service here is a fake (tests/fake_service.py): a real WebSocket server that answers as a
malicious or broken service would; the real service never sends such frames.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from local_draft.server_only import ServerOnlyGenerator
from local_draft.service_trust import said_by_service, token_id_problem
from local_draft.speculator import Speculator
from local_draft.verify_client import ServiceUnreachable, VerifyClient, VerifyError
from tests.conftest import hello_for
from tests.fake_service import FakeService, honest_answer
from wire.protocol import Error, Generate, Generated, SamplingParams, Verdict, Verify, Welcome

SPECWIRE = str(Path(sys.executable).parent / "specwire")
OSC52 = "\x1b]52;c;aGVsbG8=\x07"  # writes "hello" to the clipboard of a terminal that shows it
HUGE_ID = 10**9


def bad_verdict_after(rounds: int):
    """Honest answers for `rounds` rounds, then a Verdict whose token is far outside the vocabulary."""
    honest = honest_answer()

    def answer(message, state):
        if isinstance(message, Verify) and state.rounds >= rounds:
            return [Verdict(seq=message.seq, accepted=0, token=HUGE_ID, committed_len=len(state.committed) + 1)]
        return honest(message, state)

    return answer


def generate(url: str, tiny, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([SPECWIRE, "generate", "--server", url, "--draft", str(tiny.draft), "--prompt",
                           "def f(x):", "--max-tokens", "8", "--draft-threads", "1", *flags],
                          capture_output=True, timeout=120)


def test_an_out_of_range_verdict_ends_generate_with_an_error_naming_the_service(tiny):
    """A Verdict of token 10**9 used to abort `specwire generate` inside llama.cpp (SIGABRT, no
    message); now it exits 2 with a line naming the service and the bad id."""
    fake = FakeService(bad_verdict_after(0))
    try:
        for mode in (["--mode", "rounds", "--k", "2"], ["--mode", "rounds", "--k", "0"]):
            run = generate(fake.url, tiny, *mode)
            err = run.stderr.decode()
            assert run.returncode == 2, (run.returncode, err[-2000:])
            assert f"the verification service at {fake.url} sent a Verdict with token id {HUGE_ID}" in err, err
    finally:
        fake.close()


def test_an_out_of_range_stream_token_is_refused_before_it_is_shown(tiny, close_draft):
    """Server-only and default mode: a Generated frame with a bad id raises a fatal VerifyError; the tokens
    streamed before it were committed (kept), the bad one never was."""
    def answer(message, state):
        if isinstance(message, Generate):
            return [Generated(seq=message.seq, tokens=[5], committed_len=1),
                    Generated(seq=message.seq, tokens=[6, -1], committed_len=3, done=True)]
        return honest_answer()(message, state)

    fake = FakeService(answer)
    client = VerifyClient(fake.url, hello_for(close_draft))
    kept = []
    try:
        with pytest.raises(VerifyError) as error:
            ServerOnlyGenerator(client, close_draft.end_ids).generate([1, 2], 8,
                                                                     on_commit=lambda ids, _: kept.extend(ids))
        assert error.value.fatal and error.value.code == "bad_token_from_service"
        assert "token id -1 is outside" in str(error.value) and fake.url in str(error.value)
        assert kept == [5]
        for mode in (["--mode", "server"], []):  # the default mode streams too, with guesses alongside
            run = generate(fake.url, tiny, *mode)
            assert run.returncode == 2 and b"sent a Generated with token id -1" in run.stderr, run.stderr[-2000:]
    finally:
        client.close()
        fake.close()


def test_a_verdict_accepting_more_than_was_drafted_is_refused(close_draft):
    """accepted is checked against the block sent: 3 of 2 drafted is a broken service."""
    def answer(message, state):
        return [Verdict(seq=message.seq, accepted=3, token=5, committed_len=9)]

    fake = FakeService(answer)
    client = VerifyClient(fake.url, hello_for(close_draft))
    try:
        with pytest.raises(VerifyError, match="accepted 3 of 2 draft tokens"):
            client.verify(Verify(seq=1, committed_len=0, append=[1], draft=[4, 5]))
    finally:
        client.close()
        fake.close()


def test_a_speculating_reply_keeps_what_was_verified_before_the_bad_id(close_draft):
    """Two honest rounds, then a bad id: the generation ends with the service named (the drafter
    never saw the id: it would have aborted the process), and the first rounds' tokens were committed."""
    fake = FakeService(bad_verdict_after(2))
    client = VerifyClient(fake.url, hello_for(close_draft))
    kept = []
    try:
        with pytest.raises(VerifyError, match="sent a Verdict with token id 1000000000"):
            Speculator(close_draft, client, SamplingParams(), k=2).generate(
                close_draft.tokenize("def f(x):"), 16, on_commit=lambda ids, _: kept.extend(ids))
        assert kept == [5, 5]
    finally:
        client.close()
        fake.close()


def test_every_word_a_service_says_is_escaped(close_draft):
    """An Error's code and message, the Welcome's target, a stream's stop reason and a close reason
    reach the client's exceptions and frames with their escape sequences written out."""
    def welcome(hello):
        return Welcome(session_id="s\x1b[2J", max_context=4096, max_draft=16, vocab_size=hello.vocab_size,
                       target="evil" + OSC52, capabilities=["generate\x1b[1A"])

    def answer(message, state):
        if isinstance(message, Generate):
            return [Generated(seq=message.seq, tokens=[5], committed_len=1, done=True, stop_reason="eos" + OSC52)]
        return [Error(code="bad" + OSC52, message="try again\n" + OSC52 + "\u202e")]

    fake = FakeService(answer, welcome)
    client = VerifyClient(fake.url, hello_for(close_draft))
    try:
        assert client.welcome.target == "evil\\x1b]52;c;aGVsbG8=\\x07"
        assert "\x1b" not in client.welcome.session_id + "".join(client.welcome.capabilities)
        client.send_generate(Generate(seq=1, committed_len=0, append=[1]))
        assert client.receive_generated(first=True).stop_reason == "eos\\x1b]52;c;aGVsbG8=\\x07"
        with pytest.raises(VerifyError) as error:
            client.verify(Verify(seq=2, committed_len=1))
        said = str(error.value) + error.value.code
        assert "\x1b" not in said and "\n" not in said and "\u202e" not in said
        assert str(error.value) == "try again\\n\\x1b]52;c;aGVsbG8=\\x07\\u202e"
    finally:
        client.close()
        fake.close()
    # the close reason of a connection the service ends is quoted escaped too
    assert "\x1b" not in str(ServiceUnreachable("lost it: received 1001 (going away) " + OSC52))


def test_generate_prints_a_service_error_without_its_escape_sequences(tiny):
    """`specwire generate` against a service whose refusal carries OSC 52: stderr holds no ESC."""
    fake = FakeService(lambda message, state: [Error(code="nope", message="refused " + OSC52, fatal=True)])
    try:
        run = generate(fake.url, tiny, "--k", "0")
    finally:
        fake.close()
    assert run.returncode == 2 and b"refused \\x1b]52;c;aGVsbG8=\\x07" in run.stderr, run.stderr[-2000:]
    assert b"\x1b" not in run.stderr


def test_the_checks_themselves():
    """The one range check and the one escaping function, on their edges."""
    assert token_id_problem([], 10) is None and token_id_problem([0, 9], 10) is None
    assert token_id_problem([0, 10], 10) == "token id 10 is outside this vocabulary's [0, 10)"
    assert token_id_problem([-1], 10).startswith("token id -1")
    assert said_by_service("ok") == "ok" and said_by_service("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert len(said_by_service("x" * 10_000)) == 2000


def test_generate_shows_a_model_escape_sequence_on_a_terminal_and_keeps_it_with_raw(tiny, close_draft):
    """Model output to a terminal (a pty here) has its control characters shown as symbols: the
    reply's OSC 52 arrives as text. --raw, and any pipe, keep the bytes as the model wrote them."""
    import os
    import pty

    ids = close_draft.tokenize(OSC52, add_bos=False)

    def answer(message, state):
        if isinstance(message, Generate):
            return [Generated(seq=message.seq, tokens=ids, committed_len=len(ids) + 1, done=True,
                              stop_reason="max_tokens")]
        return honest_answer()(message, state)

    fake = FakeService(answer)

    def on_a_terminal(*flags: str) -> bytes:
        controller, terminal = pty.openpty()
        try:
            process = subprocess.Popen([SPECWIRE, "generate", "--server", fake.url, "--draft", str(tiny.draft),
                                        "--prompt", "hi", "--mode", "server", *flags],
                                       stdout=terminal, stderr=subprocess.DEVNULL)
            os.close(terminal)
            out = b""
            while True:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the pty closed with the process
                    break
                if not chunk:
                    break
                out += chunk
            assert process.wait(60) == 0
            return out
        finally:
            os.close(controller)

    try:
        shown, raw = on_a_terminal(), on_a_terminal("--raw")
        piped = generate(fake.url, tiny, "--mode", "server").stdout
    finally:
        fake.close()
    assert b"\x1b" not in shown and "\u241b]52;c;aGVsbG8=\u2407".encode() in shown
    assert OSC52.encode() in raw and OSC52.encode() in piped


def own_address() -> str:
    """This machine's address on its network (not loopback): where a "remote" service is reached."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this picks the route's source address
        except OSError:
            pytest.skip("this machine has no network address but loopback: no remote service can be reached")
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no network address but loopback")
    return address


def test_a_token_sent_in_the_clear_to_another_machine_is_warned_about(tiny, close_draft, tmp_path, caplog):
    """A token over plain ws:// to a non-loopback address: the client warns, once per address, and
    `generate` says so on stderr; to loopback, or without a token, not a word."""
    fake = FakeService(honest_answer(), host="0.0.0.0")
    remote = f"ws://{own_address()}:{fake.port}"
    token = tmp_path / "token"
    token.write_text("s3cret")
    token.chmod(0o600)
    try:
        with caplog.at_level("WARNING", logger="local_draft.verify_client"):
            loopback = f"ws://127.0.0.1:{fake.port}"
            for url, with_token in ((loopback, "s3cret"), (remote, None), (remote, "s3cret"), (remote, "s3cret")):
                VerifyClient(url, hello_for(close_draft), token=with_token).close()
        warnings = [record.getMessage() for record in caplog.records if "in the clear" in record.getMessage()]
        assert len(warnings) == 1 and remote.removeprefix("ws://") in warnings[0], warnings
        run = generate(remote, tiny, "--k", "0", "--token-file", str(token))
        assert run.returncode == 0 and b"the bearer token goes to " + remote.encode() + b" in the clear" in run.stderr
    finally:
        fake.close()


def test_log_probabilities_a_service_sends_are_bounded_and_their_ids_checked():
    """Alternatives outside the vocabulary are a problem; NaN and positive figures become log probabilities."""
    from local_draft.service_trust import frame_token_ids, with_words_escaped
    from wire.protocol import TokenLogprobs

    frame = Generated(seq=1, tokens=[5], committed_len=3,
                      logprobs=[TokenLogprobs(float("nan"), [7, HUGE_ID], [3.0, -1.0]), TokenLogprobs(-1.0)])
    assert token_id_problem(frame_token_ids(frame), 100) is not None
    cleaned = with_words_escaped(frame)
    assert len(cleaned.logprobs) == 1  # one per token at most
    assert cleaned.logprobs[0].logprob == float("-inf") and cleaned.logprobs[0].top_logprobs == [0.0, -1.0]
