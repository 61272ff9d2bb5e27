"""`/save`: a chat as Markdown, with a code block a stopped reply left open closed."""

from __future__ import annotations

from app.chat.conversation import Conversation, Reply, Turn
from app.chat.export import close_open_fence, to_markdown


def _turn(number: int, user: str, text: str, stop_reason: str = "eos") -> Turn:
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    return Turn(number, user, "t", Reply(list(range(len(pieces))), ["target"] * len(pieces), pieces,
                                          stop_reason=stop_reason))


def _fence_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.lstrip().startswith(("```", "~~~")))


def test_a_code_block_left_open_is_closed_with_its_own_fence():
    """An open ``` or ~~~~ block gets its closing line; closed blocks and plain text are left alone."""
    assert close_open_fence("see:\n```python\ndef f():\n    return") == "see:\n```python\ndef f():\n    return\n```"
    assert close_open_fence("~~~~\ncode\n~~~\nmore") == "~~~~\ncode\n~~~\nmore\n~~~~"  # ~~~ is too short to close
    closed = "a\n```\ncode\n```\nb"
    assert close_open_fence(closed) == closed
    assert close_open_fence("no code at all") == "no code at all"


def test_a_stopped_reply_inside_a_code_block_does_not_swallow_the_rest_of_the_chat():
    """Turn 1 stopped inside a code block: the saved document closes it before turn 2's heading."""
    conversation = Conversation(chat_id="c", turns=[
        _turn(1, "write quicksort", "Here:\n```python\ndef quicksort(arr):\n    if", "stopped"),
        _turn(2, "thanks", "You are welcome.")])
    document = to_markdown(conversation, "draft ⇢ target")
    before_turn_two = document.split("## You\n\nthanks")[0]
    assert _fence_lines(before_turn_two) == 2 and "## You\n\nthanks" in document


def test_a_saved_document_shows_control_characters_and_is_private(tmp_path):
    """/save: a reply's escape sequence (OSC 52, a cursor move) is written as visible symbols, so
    `cat` of the file cannot act on the terminal; the file is created 0600."""
    import os

    from app.chat.export import save_markdown

    conversation = Conversation(chat_id="c", turns=[_turn(1, "hi\x1b[2J", "ok\x1b]52;c;aGk=\x07 done")])
    old_umask = os.umask(0o022)
    try:
        path = save_markdown(conversation, "draft ⇢ target", tmp_path / "chat.md")
    finally:
        os.umask(old_umask)
    text = path.read_text(encoding="utf-8")
    assert "\x1b" not in text and "\x07" not in text
    assert "ok\u241b]52;c;aGk=\u2407 done" in text and "hi\u241b[2J" in text
    assert path.stat().st_mode & 0o777 == 0o600
