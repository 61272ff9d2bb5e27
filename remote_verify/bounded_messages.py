"""Client message types whose every list has a length bound, for the service's decoder.

The wire types (wire/protocol.py) take lists of any length. Decoding one into Python
objects costs time and memory in proportion to its elements, on the event loop, before
any check can refuse it: a 1 MiB frame holds a million token ids, or a million empty
lists. The types here are subclasses of the wire types (the rest of the service sees a
`Verify`, a `Sync`, ...) with `max_length` on each list. msgpack states an array's length
in its header, and msgspec checks the bound there, before decoding an element, so a frame
that breaks a bound is refused after a few bytes; one that keeps every bound decodes into
at most `max_context` ids per history and `max_draft` entries per draft.

The one free-text field a round carries, `Verify.draft_source`, is bounded the same way.
What remains is proportional to the frame's bytes without building anything: skipping a
field this version does not know (fields are only appended) and reading strings.
"""

from __future__ import annotations

from typing import Annotated, Optional, Union

import msgspec

from wire.limits import MAX_DIST_TOKENS, MAX_DRAFT_SOURCE_CHARS, MAX_GRAMMAR_BYTES, MAX_STOP_IDS, MAX_TREE_NODES
from wire.protocol import Cancel, Draft, Generate, Grammar, Hello, SparseDist, Sync, Verify


def _bounded(length: int, element=int):
    return Annotated[list[element], msgspec.Meta(max_length=length)]


def _short_text(length: int):
    return Annotated[str, msgspec.Meta(max_length=length)]


def bounded_client_message(max_context: int, max_draft: int):
    """The union of client messages with every list bounded; for `msgspec.msgpack.Decoder`.

    A history list may hold the whole context (longer ones cannot fit; the session refuses
    those of exactly the context's length with its own message), a draft `max_draft`
    tokens, a draft distribution MAX_DIST_TOKENS ids. A Verify's `draft_source` is a short
    string: any value within MAX_DRAFT_SOURCE_CHARS is taken (the metrics fold names they do
    not know into one label), a longer one is refused from its length header.
    """
    dist = msgspec.defstruct("SparseDist", [("ids", _bounded(MAX_DIST_TOKENS)),
                                            ("probs", _bounded(MAX_DIST_TOKENS, float))],
                             bases=(SparseDist,), array_like=True)
    verify = msgspec.defstruct("Verify", [("append", _bounded(max_context), []),
                                          ("draft", _bounded(max_draft), []),
                                          ("draft_dists", _bounded(max_draft, dist), []),
                                          ("draft_source", _short_text(MAX_DRAFT_SOURCE_CHARS), "")],
                               bases=(Verify,), tag="verify")
    sync = msgspec.defstruct("Sync", [("tokens", _bounded(max_context))], bases=(Sync,), tag="sync")
    # a grammar's schema is refused from its length header past MAX_GRAMMAR_BYTES characters (its
    # UTF-8 bytes are counted when it is checked: wire/grammar.py)
    grammar = msgspec.defstruct("Grammar", [("kind", _short_text(MAX_DRAFT_SOURCE_CHARS)),
                                            ("schema", _short_text(MAX_GRAMMAR_BYTES), "")],
                                bases=(Grammar,), frozen=True)
    generate = msgspec.defstruct("Generate", [("append", _bounded(max_context), []),
                                              ("stop_ids", _bounded(MAX_STOP_IDS), []),
                                              ("grammar", Optional[grammar], None)],
                                 bases=(Generate,), tag="generate")
    # a chain of guesses may reach past the draft limit (it covers positions the stream passes
    # while it travels), never past the context; a tree's parents, MAX_TREE_NODES (its shape is
    # checked once decoded: wire/draft_tree.py `tree_problem`)
    draft = msgspec.defstruct("Draft", [("tokens", _bounded(max_context)),
                                        ("source", _short_text(MAX_DRAFT_SOURCE_CHARS), ""),
                                        ("parents", _bounded(MAX_TREE_NODES), [])],
                              bases=(Draft,), tag="draft")
    return Union[Hello, verify, sync, generate, draft, Cancel]
