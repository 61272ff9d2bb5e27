"""The chat engine without a screen: exact replies, tokens kept across turns, offline and remote modes."""

from __future__ import annotations

import pytest

from app.chat.engine import ChatEngine
from app.chat.state import StartupProblem
from tests.local_draft.test_fallback import target_alone


class Recorder:
    """An EngineListener that keeps what it hears."""

    def __init__(self):
        self.notes, self.rounds, self.connections, self.readings = [], [], [], []

    def progress(self, text, from_service=False):
        pass

    def reading(self, turn, prompt_tokens, unread_tokens):
        self.readings.append((turn, prompt_tokens, unread_tokens))

    def committed(self, turn, provenance, pieces, stats):
        self.rounds.append((turn, provenance, pieces))

    def connection_changed(self, connection):
        self.connections.append(connection)

    def note(self, turn, text):
        self.notes.append((turn, text))


def _engine(settings) -> tuple[ChatEngine, list[list[int]]]:
    """A started engine whose Speculator contexts are recorded (the prompt each reply continued)."""
    engine = ChatEngine(settings, Recorder())
    engine.start()
    contexts = []
    generate = engine.speculator.generate

    def recording(context, *args, **kwargs):
        contexts.append(list(context))
        return generate(context, *args, **kwargs)

    engine.speculator.generate = recording
    return engine, contexts


def test_greedy_replies_are_the_targets_own_and_earlier_tokens_are_kept_as_generated(
        chat_settings, tiny_service, llamacpp_target):
    """Two turns against a real service: each reply equals the target alone on the same context, and the
    second context starts with the first prompt plus the first reply's tokens, not a re-tokenization."""
    engine, contexts = _engine(chat_settings(server=tiny_service, max_tokens=40))
    try:
        first = engine.reply("def quicksort(arr):", lambda: False)
        second = engine.reply("and now in C", lambda: False)
    finally:
        engine.close()
    assert first.stop_reason == second.stop_reason == "max_tokens"
    turns = engine.conversation.turns
    for context, turn in zip(contexts, turns):
        assert turn.reply.token_ids == target_alone(llamacpp_target, context, len(turn.reply.token_ids))
        assert set(turn.reply.provenance) <= {"draft", "target"} and "draft" in turn.reply.provenance
    assert contexts[1][: len(contexts[0]) + 40] == contexts[0] + turns[0].reply.token_ids
    (_, first_all, first_unread), (_, second_all, second_unread) = engine.listener.readings
    assert first_all == first_unread == len(contexts[0])  # nothing read before the first turn
    assert second_all == len(contexts[1]) and second_unread == len(contexts[1]) - len(contexts[0]) - 40
    assert contexts[0] == engine.draft.tokenize(engine.template.render(engine.conversation.messages()[:1]))


def test_offline_replies_are_marked_unverified(chat_settings):
    """--offline: the draft model alone, every token marked offline, the mode says so."""
    engine, _ = _engine(chat_settings(offline=True, max_tokens=12))
    try:
        outcome = engine.reply("hello", lambda: False)
    finally:
        engine.close()
    assert engine.mode == "offline" and engine.service is None
    assert engine.conversation.turns[0].reply.provenance == ["offline"] * 12
    assert outcome.stats["offline"] == 12 and outcome.stats["mode"] == "offline"


def test_k_zero_is_remote_mode_where_the_service_writes_every_token(chat_settings, tiny_service):
    """/k 0: nothing drafted, each token is the target's."""
    engine, _ = _engine(chat_settings(server=tiny_service, max_tokens=10))
    try:
        engine.set_k(0)
        engine.reply("hello", lambda: False)
        assert engine.mode == "remote"
        with pytest.raises(ValueError, match="longest draft"):
            engine.set_k(1000)
    finally:
        engine.close()
    assert engine.conversation.turns[0].reply.provenance == ["target"] * 10


def test_a_long_chat_leaves_out_its_oldest_turns_with_a_note_and_keeps_them_saved(chat_settings, tiny_service):
    """A context of 256 tokens: the third turn no longer sees the first; the note says so; the file keeps all."""
    engine, contexts = _engine(chat_settings(server=tiny_service, max_tokens=40, context=256))
    try:
        for n in range(4):
            engine.reply(f"question number {n} " * 3, lambda: False)
    finally:
        engine.close()
    notes = [text for _, text in engine.listener.notes if "no longer fit" in text]
    assert notes and "saved chat keeps them" in notes[0]
    assert all(len(context) <= 256 - 40 for context in contexts)
    saved = type(engine.conversation).load(engine.chat.path)
    assert len(saved.turns) == 4 and any("no longer fit" in note for turn in saved.turns for note in turn.reply.notes)


def test_adaptive_k_is_kept_across_turns_and_chats(chat_settings, tiny_service):
    """One controller serves every turn (its state grows from turn to turn) and is saved after each reply;
    the next chat against the same service and pair starts from the saved state."""
    import json

    from local_draft.controller_memory import memory_path

    engine, _ = _engine(chat_settings(server=tiny_service, max_tokens=24))
    controller = engine.speculator.controller
    try:
        engine.reply("def quicksort(arr):", lambda: False)
        after_first = controller.state()
        engine.reply("and now in C", lambda: False)
    finally:
        engine.close()
    assert engine.speculator.controller is controller and controller.state() != after_first
    saved = json.loads(memory_path().read_text())
    assert list(saved.values()) == [json.loads(json.dumps(controller.state()))]
    again, _ = _engine(chat_settings(server=tiny_service, max_tokens=24))
    try:
        assert again.speculator.controller.state() == list(saved.values())[0]
    finally:
        again.close()


def test_a_missing_draft_model_is_reported_before_the_service_starts(chat_settings, tmp_path):
    """The draft file is gone: start() says so at once, and no embedded service was started for nothing."""
    engine = ChatEngine(chat_settings(draft=tmp_path / "gone.gguf"), Recorder())
    try:
        with pytest.raises(StartupProblem, match="no draft model at") as raised:
            engine.start()
        assert raised.value.kind == "missing_model" and not raised.value.offline_possible
        assert engine.service is None
    finally:
        engine.close()


def test_the_default_mode_streams_and_marks_the_kept_guesses(chat_settings, paced_service, llamacpp_target):
    """The chat's default (the service streams, the drafter guesses ahead) against a GPU-paced service:
    the reply is the target's alone, and tokens that were kept guesses are marked as drafts. A pass of the
    paced service takes 4 ms: with every core busy (the suite's other workers) the drafter can fall behind
    every pass of a reply, and none of its guesses is kept; the reply is asked again, up to three times,
    until one is, each reply checked against the target alone."""
    for attempt in range(3):
        engine, contexts = _engine(chat_settings(server=paced_service.url, mode="hybrid", k=None, max_tokens=40))
        try:
            reply = engine.reply("def quicksort(arr):", lambda: False)
        finally:
            engine.close()
        turn = engine.conversation.turns[0]
        assert reply.stop_reason == "max_tokens"
        assert turn.reply.token_ids == target_alone(llamacpp_target, contexts[0], 40)
        assert set(turn.reply.provenance) <= {"draft", "target"}
        if "draft" in turn.reply.provenance:
            break
    assert "draft" in turn.reply.provenance, f"no kept guess was marked in {attempt + 1} replies"
