"""The chat engine with n-gram drafting: no model (--draft ngram) and mixed, exact replies, stats by drafter."""

from __future__ import annotations

import pytest

from app.chat.stats_table import stats_table
from app.chat.widgets.assistant_turn import reply_summary
from tests.app.chat.conftest import start_tiny_service
from tests.app.chat.test_engine import _engine
from tests.local_draft.test_fallback import target_alone

REPEATING = "Repeat this line twice: x = 1; y = 2; z = x + y; x = 1; y = 2; z = x + y;"


@pytest.mark.parametrize("drafting", ["ngram", "mixed"])
def test_ngram_and_mixed_replies_are_the_targets_own_with_acceptance_by_drafter(chat_settings, tiny_service,
                                                                                 llamacpp_target, drafting):
    """Two turns: each reply equals the target alone; the stats, the reply's line and /stats count each drafter."""
    engine, contexts = _engine(chat_settings(server=tiny_service, max_tokens=40, drafting=drafting, k=None))
    try:
        engine.reply(REPEATING, lambda: False)
        engine.reply(REPEATING, lambda: False)  # the first turn is in the context: much to copy
    finally:
        engine.close()
    assert engine.speculator.draft is None if drafting == "ngram" else engine.speculator.draft is engine.draft
    turns = engine.conversation.turns
    for context, turn in zip(contexts, turns):
        assert turn.reply.token_ids == target_alone(llamacpp_target, context, len(turn.reply.token_ids))
    sources = turns[1].reply.stats["by_source"]
    assert "ngram" in sources and sources["ngram"]["drafted"] > 0, sources
    if drafting == "ngram":
        assert "model" not in sources, sources  # no model runs at all
    summary = reply_summary(turns[1].reply, turns[1].reply.stats, steady=True)
    assert f"n-gram {sources['ngram']['accepted']}/{sources['ngram']['drafted']}" in summary, summary
    table = stats_table(engine.conversation, steady=True)
    assert [column.header for column in table.columns][-2:] == ["n-gram", "model"]


def test_without_a_model_a_lost_service_ends_the_reply_with_a_note(chat_settings, tiny, monkeypatch):
    """--draft ngram: no offline fallback; a service that does not come back ends the reply with a note."""
    import app.chat.engine as engine_module

    monkeypatch.setattr(engine_module, "NO_MODEL_RESUME_S", 1.0)
    process, url = start_tiny_service(tiny.target_gguf)
    engine, _ = _engine(chat_settings(server=url, max_tokens=200, drafting="ngram"))
    try:
        with pytest.raises(ValueError, match="no offline mode"):
            engine.go_offline()

        def kill_after_a_few_rounds():
            if len(engine.listener.rounds) == 3:
                process.kill()
                process.wait()
            return False

        outcome = engine.reply("hello", kill_after_a_few_rounds)
    finally:
        engine.close()
        process.kill()
        process.wait()
    assert outcome.stop_reason == "error"
    assert "offline" not in engine.conversation.turns[0].reply.provenance
    assert any("no local model to continue offline" in text for _, text in engine.listener.notes), engine.listener.notes
