"""The chat against a service that sends what no real service does (a fake: tests/fake_service.py):
a bad id ends the reply with a note naming the service and keeps the conversation so far; what the
service says reaches the note escaped."""

from __future__ import annotations

from app.chat.engine import ChatEngine
from app.chat.store import read_events
from tests.app.chat.test_engine import Recorder
from tests.fake_service import FakeService
from tests.local_draft.test_service_trust import OSC52, bad_verdict_after
from wire.protocol import Error


def test_a_bad_id_ends_the_reply_and_keeps_the_conversation(chat_settings):
    """Two rounds verified, then a Verdict of token 10**9: the reply ends ("error"), its two tokens
    are in the conversation and in the saved chat, and the note names the service and the id."""
    fake = FakeService(bad_verdict_after(2))
    listener = Recorder()
    engine = ChatEngine(chat_settings(server=fake.url, k=2), listener)
    try:
        engine.start()
        outcome = engine.reply("def f(x):", lambda: False)
    finally:
        engine.close()
        fake.close()
    assert outcome.stop_reason == "error"
    reply = engine.conversation.reply_of(outcome.turn)
    assert reply.token_ids == [5, 5] and reply.provenance == ["target", "target"]
    saved = [event for event in read_events(engine.chat.path) if type(event).__name__ == "Committed"]
    assert [id_ for event in saved for id_ in event.ids] == [5, 5]
    notes = [text for turn, text in listener.notes if turn == outcome.turn]
    assert any(f"the verification service at {fake.url} sent a Verdict with token id 1000000000" in note
               for note in notes), notes


def test_a_service_error_is_noted_with_its_escape_sequences_written_out(chat_settings):
    """An Error whose message carries OSC 52 and a newline: the note shows them as text."""
    fake = FakeService(lambda message, state: [Error(code="nope", message="go away\n" + OSC52)])
    listener = Recorder()
    engine = ChatEngine(chat_settings(server=fake.url, k=2), listener)
    try:
        engine.start()
        engine.reply("hello", lambda: False)
    finally:
        engine.close()
        fake.close()
    notes = " ".join(text for _, text in listener.notes)
    assert "go away\\n\\x1b]52;c;aGVsbG8=\\x07" in notes and "\x1b" not in notes and "\n" not in notes
