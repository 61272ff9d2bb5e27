"""Stop strings: the text before the first stop, never a sent character that turns out to be part of one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.stop_strings import StopCutter


def cut_by_pieces(pieces: list[str], stops: list[str]) -> str:
    """The rule, by brute force: after each piece, the text before the earliest-starting stop now complete."""
    text = ""
    for piece in pieces:
        text += piece
        found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
        if found:
            return text[: min(found)]
    return text


def stream(pieces: list[str], stops: list[str]) -> list[str]:
    cutter = StopCutter(stops)
    sent = [cutter.feed(piece) for piece in pieces]
    return sent + [cutter.flush()]


def test_a_stop_split_across_pieces_is_held_back_then_cut():
    """"<|end|>" arriving as "<|", "en", "d|>": nothing of it is ever sent, the text before it is."""
    assert stream(["Hello <|", "en", "d|> more"], ["<|end|>"]) == ["Hello ", "", "", ""]


def test_text_held_back_as_a_possible_stop_is_sent_once_it_is_not_one():
    """"<|" waits while it could start a stop, and goes out with the piece that shows it does not."""
    assert stream(["a <|", "x"], ["<|end|>"]) == ["a ", "<|x", ""]
    assert stream(["a <|"], ["<|end|>"]) == ["a ", "<|"]  # the generation ended: held text is flushed


def test_the_first_stop_to_appear_wins_and_the_earliest_within_one_piece():
    """Of stops completed by one piece the earliest starting cuts; a stop completed earlier wins over one
    that would have started before it but completes later."""
    assert "".join(stream(["xx STOP and END"], ["END", "STOP"])) == "xx "
    assert "".join(stream(["ab", "c", "d"], ["abcd", "bc"])) == "a"


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="ab\n", max_size=30), cuts=st.lists(st.integers(0, 30), max_size=10),
       stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), min_size=1, max_size=3))
def test_streamed_pieces_add_up_to_the_rule_and_never_run_ahead_of_it(text, cuts, stops):
    """Any text in any pieces: what is sent adds up to the text before the first stop, and at every step
    what was sent so far is a prefix of that (nothing sent is taken back)."""
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    expected = cut_by_pieces(pieces, stops)
    sent = stream(pieces, stops)
    assert "".join(sent) == expected
    for i in range(len(sent)):
        assert expected.startswith("".join(sent[: i + 1]))
