"""What the model is shown: the system prompt, the turns, and the oldest turns left out when full."""

from __future__ import annotations

import pytest

from app.chat.conversation import Conversation, Reply, Turn


def _conversation(turns: int) -> Conversation:
    conversation = Conversation(system="sys")
    for n in range(1, turns + 1):
        conversation.turns.append(Turn(n, f"question {n}", "t", Reply(pieces=[f"answer {n}"])))
    return conversation


def _count_words(messages) -> int:
    return sum(len(m.content.split()) for m in messages)


def test_messages_hold_the_system_prompt_every_turn_and_the_new_message():
    """Roles alternate; a turn without a reply sends only its question."""
    conversation = _conversation(2)
    conversation.turns.append(Turn(3, "unanswered", "t"))
    messages = conversation.messages("new")
    assert [m.role for m in messages] == ["system", "user", "assistant", "user", "assistant", "user", "user"]
    assert messages[-1].content == "new" and messages[1].content == "question 1"


def test_the_oldest_turns_are_left_out_when_the_context_is_full():
    """Each turn is 4 words here: a budget of 10 keeps the system prompt, the last turn and the new message."""
    conversation = _conversation(3)
    messages, dropped = conversation.fit("new message", _count_words, budget=10)
    assert dropped == 2
    assert [m.content for m in messages] == ["sys", "question 3", "answer 3", "new message"]
    messages, dropped = conversation.fit("new", _count_words, budget=100)
    assert dropped == 0 and len(messages) == 8


def test_a_message_that_cannot_fit_is_an_error_that_says_so():
    """Even alone with the system prompt it is too long: ValueError naming both sizes."""
    with pytest.raises(ValueError, match="shorten it"):
        _conversation(1).fit("a b c d e f g h i j", _count_words, budget=5)
