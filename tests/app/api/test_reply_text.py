"""A reply's tokens as text: decoded across split characters, cut at a stop or an end token, counted."""

from __future__ import annotations

from app.api.reply_text import ReplyText


def test_a_character_split_across_tokens_is_sent_whole_with_its_last_byte(close_draft):
    """Tokens of "héllo wörld ☃" fed one by one: no replacement character on the way, the text at the end."""
    tokens = close_draft.tokenize("héllo wörld ☃", add_bos=False)
    text = ReplyText(close_draft.token_bytes, close_draft.end_ids, [])
    sent = [text.add([t], ["draft"]) for t in tokens] + [text.finish()]
    assert "".join(sent) == "héllo wörld ☃" and "\ufffd" not in "".join(sent)
    assert len(tokens) > len("héllo wörld ☃".split())  # the tiny vocabulary does split the characters


def test_a_stop_across_rounds_ends_the_reply_at_the_token_that_completes_it(close_draft):
    """The stop "rld" completed mid-round: the text before it, the tokens up to that one, the rest dropped."""
    tokens = close_draft.tokenize("hello world and more", add_bos=False)
    text = ReplyText(close_draft.token_bytes, close_draft.end_ids, ["rld"])
    sent = text.add(tokens[:2], ["target", "draft"]) + text.add(tokens[2:], ["draft"] * (len(tokens) - 2))
    assert sent + text.finish() == "hello wo" and text.ended and text.stopped_at_string
    decoded = b"".join(close_draft.token_bytes(t) for t in text.token_ids).decode()
    assert "rld" in decoded and not decoded[:-1].endswith("rld")  # the last token kept completes the stop
    assert text.provenance == [["target", 1], ["draft", len(text.token_ids) - 1]]


def test_an_end_token_ends_the_reply_and_what_comes_after_it_is_not_counted(close_draft):
    """Tokens after the end token in the same round are not the reply's."""
    tokens = close_draft.tokenize("hi", add_bos=False)
    text = ReplyText(close_draft.token_bytes, close_draft.end_ids, [])
    text.add(tokens + [close_draft.eos_id] + tokens, ["target"] * (2 * len(tokens) + 1))
    assert text.token_ids == tokens + [close_draft.eos_id] and text.sent == "hi" and not text.stopped_at_string
