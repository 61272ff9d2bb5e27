"""Reading client frames: a decoded message, or a `BadFrame` that names what is wrong.

The service answers every frame. Undecodable bytes, a message type it does not know and
a field of the wrong type are each told apart, so that the client's author reads what to
fix. A Hello is checked further here (sampling parameters, seed, vocabulary) before a
session is built from it.

Reading a frame costs at most a pass over its bytes, whatever they hold: the decoder is
built once per service with every list bounded (remote_verify/bounded_messages.py), a list
over its bound is refused from its length header, and a refused frame is never decoded
again to classify it (that is done from the decoder's error, or by reading the type tag
alone, at the frame's start). A frame's cost against its connection's rate limit grows with
its size (`frame_cost`), so a client sending large frames pays for them itself.
"""

from __future__ import annotations

import re

import msgspec

from remote_verify.bounded_messages import bounded_client_message
from wire.protocol import ClientMessage, Hello
from wire.randomness import seed_problem

CLIENT_TYPES = ("hello", "verify", "sync", "generate", "draft", "cancel")
BYTES_PER_REQUEST = 4096  # a frame counts as one request against the rate limit per 4 KiB started
MAX_QUOTED = 200  # characters of the decoder's error quoted in a refusal

# msgspec's words for a list over its bound, and for the fields whose bound is a service limit
_OVER_LENGTH = re.compile(r"Expected `array` of length <= (\d+) - at `\$\.(\w+)(.*)`")
_TEXT_OVER_LENGTH = re.compile(r"Expected `str` of length <= (\d+) - at `\$\.(\w+)`")
_HISTORY_FIELDS = ("append", "tokens")
_DRAFT_FIELDS = ("draft", "draft_dists")


class BadFrame(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def frame_cost(frame: bytes | str) -> int:
    """How many requests a frame counts as against the rate limit: one per 4 KiB started."""
    return 1 + (len(frame) - 1) // BYTES_PER_REQUEST if frame else 1


class FrameReader:
    """Decodes a service's client frames within its limits; built once, when the limits are known."""

    def __init__(self, max_context: int, max_draft: int):
        self.max_context = max_context
        self.max_draft = max_draft
        self._decoder = msgspec.msgpack.Decoder(bounded_client_message(max_context, max_draft))

    def read(self, frame: bytes | str) -> ClientMessage:
        """Decode one client frame; raises BadFrame with a code and a sentence."""
        if isinstance(frame, str):
            raise BadFrame("bad_frame", "text frames are not part of the protocol: send binary msgpack frames")
        try:
            return self._decoder.decode(frame)
        except msgspec.ValidationError as exc:
            raise self._refusal(frame, str(exc)) from None  # the decoder's words are in the message
        except (msgspec.DecodeError, ValueError) as exc:  # ValueError: invalid UTF-8 in a string, among others
            raise BadFrame("bad_frame", f"could not decode the frame as msgpack: {exc}") from None

    def _refusal(self, frame: bytes, error: str) -> BadFrame:
        """What a frame the typed decoder refused is, from its error (and at most its type tag)."""
        over = _OVER_LENGTH.fullmatch(error)
        if over:
            return self._over_length(int(over.group(1)), over.group(2), over.group(3))
        over = _TEXT_OVER_LENGTH.fullmatch(error)
        if over:
            return BadFrame("bad_request", f"{over.group(2)} is longer than {over.group(1)} characters: send a "
                            "short name (a draft_source is \"model\" or \"ngram\")")
        not_a_map = error.startswith("Expected `object`") or error == "Object missing required field `type`"
        unknown_type = error.endswith("- at `$.type`")
        if len(error) > MAX_QUOTED:  # it quotes the client's value, which may be a megabyte long
            error = error[:MAX_QUOTED] + "..."
        if not_a_map:
            return BadFrame("bad_frame", f"a message must be a msgpack map with a 'type' field: {error}")
        if unknown_type:
            return BadFrame("unknown_message", f"unknown message type ({error}): send one of "
                            f"{', '.join(CLIENT_TYPES)}")
        return BadFrame("bad_field", f"invalid {_type_of(frame)} message: {error}")

    def _over_length(self, bound: int, field: str, rest: str) -> BadFrame:
        if field in _HISTORY_FIELDS and not rest:
            return BadFrame("context_full", f"{field}: more than {bound} tokens, over the context limit of "
                            f"{self.max_context}")
        if field in _DRAFT_FIELDS and not rest:
            return BadFrame("draft_too_long", f"{field}: more than {bound} entries, over the limit of "
                            f"{self.max_draft} draft tokens")
        if field == "parents":
            return BadFrame("bad_tree", f"a draft tree of more than {bound} nodes: send at most {bound}")
        if field == "draft_dists":
            return BadFrame("bad_dists", f"a draft distribution at {field}{rest} has more than {bound} ids")
        return BadFrame("bad_request", f"{field} holds more than {bound} entries: send at most {bound}")


_MAP_HEADER_BYTES = {0xDE: 3, 0xDF: 5}  # map16, map32; a fixmap (0x80-0x8F) is one byte
_TYPE_KEY = b"\xa4type"  # "type" as a msgpack fixstr


def _type_of(frame: bytes) -> str:
    """The type tag of a frame the typed decoder got past (so a known one), read from the
    frame's first field, where an encoder of tagged structs writes it; "client" when it is
    elsewhere. Constant time: finding it further on would mean skipping over the rest."""
    first = frame[0] if frame else 0
    at = 1 if 0x80 <= first <= 0x8F else _MAP_HEADER_BYTES.get(first)
    if at is None or frame[at:at + len(_TYPE_KEY)] != _TYPE_KEY:
        return "client"
    at += len(_TYPE_KEY)
    length = frame[at] - 0xA0 if at < len(frame) else -1  # a fixstr: the tags are 4 to 8 bytes
    tag = frame[at + 1:at + 1 + length].decode("ascii", "replace") if 0 < length < 32 else ""
    return tag if tag in CLIENT_TYPES else "client"


def hello_problems(hello: Hello) -> list[str]:
    """What is wrong with a Hello's own values (the vocabulary is compared by the service)."""
    found = hello.sampling.problems()
    problem = seed_problem(hello.seed)
    if problem:
        found.append(problem)
    return found
