"""Cutting a streamed reply into prose and fenced code, provenance kept per span."""

from __future__ import annotations

from app.chat.widgets.reply_segments import SegmentSplitter, spans_from

REPLY = ["Use a", " set:\n", "``", "`python\n", "def f(x", "):\n    return x\n", "```", "\nDone."]
MARKS = ["draft", "target", "draft", "draft", "draft", "target", "draft", "draft"]


def test_fence_lines_end_segments_and_are_shown_by_none():
    splitter = SegmentSplitter()
    splitter.add(REPLY, MARKS)
    splitter.finish()
    kinds = [(s.kind, s.language, s.text) for s in splitter.segments]
    assert kinds == [("prose", "", "Use a set:"), ("code", "python", "def f(x):\n    return x"),
                     ("prose", "", "Done.")]
    code = splitter.segments[1].spans
    assert code[0] == ("def f(x", "draft") and ("):", "target") in code


def test_the_same_reply_one_character_at_a_time_gives_the_same_segments():
    whole, streamed = SegmentSplitter(), SegmentSplitter()
    whole.add(REPLY, MARKS)
    for piece, mark in zip(REPLY, MARKS):
        streamed.add(list(piece), [mark] * len(piece))
    for splitter in (whole, streamed):
        splitter.finish()
    assert [(s.kind, s.text) for s in whole.segments] == [(s.kind, s.text) for s in streamed.segments]


def test_a_line_being_written_shows_unless_it_may_become_a_fence():
    splitter = SegmentSplitter()
    splitter.add(["Hello wor"], ["draft"])
    assert splitter.visible_tail() == [("Hello wor", "draft")]
    splitter.add(["ld\n", "  ``"], ["draft", "target"])
    assert splitter.visible_tail() == []  # two backticks: the start of a fence, perhaps
    splitter.add(["`sh\nls"], ["target"])
    assert [s.kind for s in splitter.segments] == ["prose", "code"] and splitter.visible_tail() == [("ls", "target")]


def test_a_closing_fence_needs_only_backticks():
    splitter = SegmentSplitter()
    splitter.add(["```\n", "```not a close\n", "```\n", "after"], ["draft"] * 4)
    splitter.finish()
    assert [(s.kind, s.text) for s in splitter.segments] == [("prose", ""), ("code", "```not a close"),
                                                            ("prose", "after")]


def test_spans_from_cuts_a_span_and_keeps_its_provenance():
    spans = [("abc", "draft"), ("de", "target")]
    assert spans_from(spans, 0) == spans
    assert spans_from(spans, 2) == [("c", "draft"), ("de", "target")]
    assert spans_from(spans, 5) == []
