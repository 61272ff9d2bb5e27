"""Reading client frames: a decoded message, or a `BadFrame` that names what is wrong.

The service answers every frame. Undecodable bytes, a message type it does not know and
a field of the wrong type are each told apart, so that the client's author reads what to
fix. A Hello is checked further here (sampling parameters, seed, vocabulary) before a
session is built from it.
"""

from __future__ import annotations

import msgspec

from wire.protocol import ClientMessage, Hello, decode_client_message
from wire.randomness import seed_problem

CLIENT_TYPES = ("hello", "verify", "sync", "generate", "cancel")


class BadFrame(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def read_client_frame(frame: bytes | str) -> ClientMessage:
    """Decode one client frame; raises BadFrame with a code and a sentence."""
    if isinstance(frame, str):
        raise BadFrame("bad_frame", "text frames are not part of the protocol: send binary msgpack frames")
    try:
        return decode_client_message(frame)
    except msgspec.ValidationError as exc:
        kind = _message_type(frame)
        if kind is None:
            raise BadFrame("bad_frame", f"a message must be a msgpack map with a 'type' field: {exc}") from exc
        if kind not in CLIENT_TYPES:
            raise BadFrame("unknown_message", f"unknown message type {repr(kind)[:60]}: send one of "
                           f"{', '.join(CLIENT_TYPES)}") from exc
        raise BadFrame("bad_field", f"invalid {kind} message: {exc}") from exc
    except (msgspec.DecodeError, ValueError) as exc:  # ValueError: invalid UTF-8 in a string, among others
        raise BadFrame("bad_frame", f"could not decode the frame as msgpack: {exc}") from exc


def _message_type(frame: bytes) -> object | None:
    """The 'type' of a frame that is a msgpack map with one, else None (only on the error path)."""
    try:
        raw = msgspec.msgpack.decode(frame)
    except (msgspec.DecodeError, ValueError):  # ValueError: invalid UTF-8 in a string
        return None
    if isinstance(raw, dict) and "type" in raw:
        return raw["type"]
    return None


def hello_problems(hello: Hello) -> list[str]:
    """What is wrong with a Hello's own values (the vocabulary is compared by the service)."""
    found = hello.sampling.problems()
    problem = seed_problem(hello.seed)
    if problem:
        found.append(problem)
    return found
