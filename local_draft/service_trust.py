"""What a service sends, checked before the client uses it: ids within the vocabulary, words escaped.

The client trusts nothing a service sends. A token id outside the drafter's vocabulary would
reach llama.cpp's detokenizer, which reads out of bounds on it (a Verdict of token 10**9
aborted the client); text (an error's message, a close reason, the target's name, a stop
reason) would reach a terminal, where an escape sequence moves the cursor or writes the
clipboard (OSC 52). So every frame the client decodes goes through `token_id_problem`
(each frame type's ids: `frame_token_ids`) and every word a service says through
`said_by_service`, the one escaping function, before anything else sees them.
"""

from __future__ import annotations

import math
from typing import Sequence

import msgspec

from wire.limits import MAX_TOP_LOGPROBS
from wire.protocol import Generated, TokenLogprobs, Verdict, Welcome
from wire.visible_text import escaped

MAX_SAID_CHARS = 2000  # an error message is a sentence or two; a longer one is cut here


def said_by_service(text: object) -> str:
    """What a service said, as one line of printable text (escapes shown as `\\x1b`), cut at MAX_SAID_CHARS."""
    return escaped(str(text), MAX_SAID_CHARS)


def token_id_problem(ids: Sequence[int], vocab_size: int) -> str | None:
    """Why `ids` cannot be used with a vocabulary of `vocab_size` tokens, or None when every id is in range."""
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):  # one pass each in C
        return None
    bad = next(token for token in ids if not 0 <= token < vocab_size)
    return f"token id {bad} is outside this vocabulary's [0, {vocab_size})"


def frame_token_ids(frame: object) -> Sequence[int]:
    """The token ids a service frame carries (none for a frame without ids)."""
    if isinstance(frame, Verdict):
        return (frame.token,)
    if isinstance(frame, Generated):
        if frame.logprobs:  # the alternatives' ids are shown as text too
            return [*frame.tokens, *(token for each in frame.logprobs for token in each.top_ids)]
        return frame.tokens
    return ()


MAX_SECONDS = 86400.0  # a timing a service reports: a day is already nonsense


def _seconds(value: float) -> float:
    """A duration the service reports, as one the client can add up: not NaN, infinite or negative."""
    return value if 0.0 <= value <= MAX_SECONDS else 0.0  # NaN fails both comparisons


def with_words_escaped(frame):
    """`frame` with every free-text field a person may read escaped, and its timings made numbers the
    client can add up (the same frame when nothing changes)."""
    if isinstance(frame, Verdict):
        timings = (frame.forward_s, frame.accept_s, frame.queue_s)
        if any(_seconds(each) != each for each in timings):
            return msgspec.structs.replace(frame, forward_s=_seconds(frame.forward_s),
                                           accept_s=_seconds(frame.accept_s), queue_s=_seconds(frame.queue_s))
        return frame
    if isinstance(frame, Generated) and (_seconds(frame.forward_s) != frame.forward_s
                                         or _seconds(frame.queue_s) != frame.queue_s):
        frame = msgspec.structs.replace(frame, forward_s=_seconds(frame.forward_s), queue_s=_seconds(frame.queue_s))
    if isinstance(frame, Welcome):
        return msgspec.structs.replace(frame, target=said_by_service(frame.target),
                                       session_id=said_by_service(frame.session_id),
                                       capabilities=[said_by_service(each) for each in frame.capabilities])
    if isinstance(frame, Generated) and frame.logprobs:
        frame = msgspec.structs.replace(frame, logprobs=_logprobs(frame))
    if isinstance(frame, Generated) and frame.stop_reason:
        return msgspec.structs.replace(frame, stop_reason=said_by_service(frame.stop_reason))
    return frame


def _logprob(value: float) -> float:
    """A log probability the client can show: at most 0, and NaN as impossible (-inf)."""
    return min(value, 0.0) if value == value else -math.inf


def _logprobs(frame: Generated) -> list[TokenLogprobs]:
    """The frame's log probabilities, one per token at most, MAX_TOP_LOGPROBS alternatives each, numbers
    that are log probabilities."""
    return [TokenLogprobs(_logprob(each.logprob), list(each.top_ids[:MAX_TOP_LOGPROBS]),
                          [_logprob(x) for x in each.top_logprobs[:len(each.top_ids[:MAX_TOP_LOGPROBS])]])
            for each in frame.logprobs[: len(frame.tokens)]]
