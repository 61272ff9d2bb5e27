"""Fuzzing the client: a fake service answers each request with generated frames (ids far out of
the vocabulary, escape sequences in every text field, garbage, valid frames out of place), and
the real client copes: a reply ends normally or with the client's own error, no id outside the
vocabulary is ever committed (llama.cpp would abort on it), and no error message a person reads
holds a control character. Code fence info strings of a reply are fuzzed into the Markdown view.

The shapes of issue 29, beside the service-side corpus of tests/remote_verify/test_fuzz.py.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local_draft.server_only import ServerOnlyGenerator
from local_draft.speculator import Speculator
from local_draft.verify_client import ServiceUnreachable, VerifyClient, VerifyError
from tests.conftest import hello_for
from tests.fake_service import FakeService
from wire.protocol import (
    Error, Generate, Generated, SamplingParams, Synced, Verdict, Verify, Welcome, encode,
)

ESCAPES = ["\x1b]52;c;aGVsbG8=\x07", "\x1b[2J\x1b[H", "\x9b31m", "\r\x1b[2K", "\u202e", "\n2026-01-01 FORGED", "\x00"]
words = st.one_of(st.text(max_size=20), st.sampled_from(ESCAPES),
                  st.builds(lambda a, b, c: a + b + c, st.text(max_size=8), st.sampled_from(ESCAPES),
                            st.text(max_size=8)))
ids = st.one_of(st.integers(0, 319), st.integers(320, 400), st.integers(-5, -1),
                st.sampled_from([10**9, 2**31, 2**63 - 1, -(2**63), 2**64 - 1]))
floats = st.floats(allow_nan=True, allow_infinity=True)


def frames(data) -> list:
    """What the fake says to one request: one or more frames (seq 0: the fake sets the request's)."""
    seq = 0
    kind = data.draw(st.sampled_from(["verdict", "verdict", "generated", "generated", "synced", "error",
                                      "welcome", "garbage"]))
    if kind == "verdict":
        return [Verdict(seq=seq, accepted=data.draw(st.integers(-3, 6)), token=data.draw(ids),
                        committed_len=data.draw(st.integers(0, 2**31)), forward_s=data.draw(floats),
                        queue_s=data.draw(floats))]
    if kind == "generated":
        done = data.draw(st.booleans())
        return [Generated(seq=seq, tokens=data.draw(st.lists(ids, min_size=1, max_size=4)), committed_len=3,
                          done=done, stop_reason=data.draw(words) if done else "", forward_s=data.draw(floats))
                for _ in range(data.draw(st.integers(1, 3)))][:-1] + [
            Generated(seq=seq, tokens=data.draw(st.lists(ids, max_size=3)), committed_len=4, done=True,
                      stop_reason=data.draw(words))]
    if kind == "synced":
        return [Synced(seq=seq, committed_len=data.draw(st.integers(0, 99)))]
    if kind == "error":
        return [Error(code=data.draw(words), message=data.draw(words), seq=seq, fatal=data.draw(st.booleans()),
                      retry_after_s=data.draw(st.one_of(st.just(0.0), st.floats(-1, 0.01),
                                                        st.sampled_from([float("nan"), float("-inf")]))))]
    if kind == "welcome":  # out of place
        return [Welcome(session_id=data.draw(words), max_context=5, max_draft=1, vocab_size=3)]
    return [data.draw(st.one_of(st.binary(max_size=24), st.just(msgspec.msgpack.encode({"type": "verdict"}))))]


def printable_message(exc: BaseException) -> bool:
    text = str(exc) + getattr(exc, "code", "")
    return text.isprintable()


def scripted(answers: list[list]):
    """An answer function that says the drawn answers in turn (each with the request's seq), then a
    fatal error: the fake's thread never draws (Hypothesis is not thread-safe)."""
    def answer(message, state) -> list:
        if not answers:
            return [Error(code="done", message="the script is over", fatal=True)]
        seq = getattr(message, "seq", 0)
        return [msgspec.structs.replace(frame, seq=seq) if hasattr(frame, "seq") else frame
                for frame in answers.pop(0)]
    return answer


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def _one_reply(data, fake: FakeService, draft, server_only: bool) -> None:
    fake.answer = scripted([frames(data) for _ in range(data.draw(st.integers(1, 8)))])
    committed: list[int] = []
    client = None
    try:
        client = VerifyClient(fake.url, hello_for(draft), stall_timeout_s=0.5, open_timeout_s=5.0)
        if server_only:
            ServerOnlyGenerator(client, draft.end_ids).generate([1, 2, 3], 6, lambda ids_, _: committed.extend(ids_))
        else:
            Speculator(draft, client, SamplingParams(), k=2).generate([1, 2, 3], 6,
                                                                      lambda ids_, _: committed.extend(ids_))
    except (VerifyError, ServiceUnreachable) as exc:
        assert printable_message(exc), repr(str(exc))
    finally:
        if client is not None:
            client.close()
    assert all(0 <= token < draft.vocab_size for token in committed), committed


def test_fuzzed_service_frames_never_reach_llama_cpp_or_a_terminal(close_draft):
    """150 speculating replies and 150 server-only replies against a fake service answering with
    fuzzed frames: each ends in a result or the client's error, whose text is printable; every
    committed id is in the vocabulary (the process would abort in llama.cpp otherwise)."""
    fake = FakeService(lambda message, state: [])
    try:
        _one_reply(fake=fake, draft=close_draft, server_only=False)
        _one_reply(fake=fake, draft=close_draft, server_only=True)
    finally:
        fake.close()
    assert len(fake.sessions) >= 250  # nearly every example reached a session


fence_infos = st.one_of(st.text(max_size=30), st.sampled_from(ESCAPES),
                        st.builds(lambda a, b: a + b, st.sampled_from(["[/x]", "[@click=app.quit]", "[b]", "[/]",
                                                                       "[link=file:///etc]", "\\[", "[red"]),
                                  st.text(max_size=10)))


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(info=fence_infos)
def test_any_fence_info_string_becomes_a_plain_title(info):
    """Whatever a model writes after ``` becomes the code block's title as plain text: no markup
    error, no style, no action, no control character."""
    from app.chat.widgets.marked_markdown import MarkedMarkdown
    from app.chat.widgets.reply_segments import Segment

    block = MarkedMarkdown._new_block(Segment("code", language=info.strip()))
    title = block._border_title
    if title is not None:
        assert not title.spans, (info, title.spans)
        assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in title.plain), repr(title.plain)


def test_garbage_from_a_service_is_a_clear_error(close_draft):
    """A frame that is not msgpack, or not a server message, ends the request with the client's own
    error naming the service (it used to escape as msgspec's DecodeError, a traceback)."""
    for garbage in (b"\xc1 not msgpack", msgspec.msgpack.encode({"type": "verdict"}), encode(Generate(seq=1, committed_len=0))):
        fake = FakeService(lambda message, state, g=garbage: [g])
        client = VerifyClient(fake.url, hello_for(close_draft))
        try:
            try:
                client.verify(Verify(seq=1, committed_len=0, append=[1]))
                raise AssertionError("no error")
            except VerifyError as exc:
                assert exc.code == "bad_frame_from_service" and exc.fatal and fake.url in str(exc)
        finally:
            client.close()
            fake.close()
