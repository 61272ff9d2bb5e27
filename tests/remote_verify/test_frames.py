"""Reading client frames: bounded cost whatever a frame holds, and refusals that say what is wrong."""

from __future__ import annotations

import time

import msgspec
import pytest

from remote_verify.frames import BadFrame, FrameReader, frame_cost
from wire.limits import MAX_DRAFT_SOURCE_CHARS
from wire.protocol import Generate, SparseDist, Sync, Verify, encode

MIB = 1024 * 1024
# Shapes of 1 MiB that cost the old reader 0.3 to 0.9 s of the event loop each (a million
# small lists built, then collected): decoded again untyped to find the type, or typed.
ATTACK_FRAMES = {
    "sync of a million empty lists": {"type": "sync", "seq": "x", "tokens": [[]] * 1048000},
    "a million empty draft distributions": {"type": "verify", "seq": 1, "committed_len": 0,
                                            "draft_dists": [[[], []]] * 340000},
    "a million-token sync": {"type": "sync", "seq": 1, "tokens": [1] * 1040000},
    "unknown type after a million lists": {"tokens": [[]] * 1040000, "type": "nonsense"},
    "a type of a million lists": {"type": [[]] * 1040000},
    "a draft_source of a mebibyte": {"type": "verify", "seq": 1, "committed_len": 0, "draft_source": "x" * 1040000},
    "an unknown field of a million lists": {"junk": [[]] * 1040000, "type": "verify", "seq": 1,
                                            "committed_len": 0},
}
DECODE_BOUND_S = 0.05  # the worst shape takes ~12 ms here (an unknown field skipped twice); the old reader 0.9 s


@pytest.fixture(scope="module")
def reader() -> FrameReader:
    return FrameReader(max_context=4096, max_draft=32)


@pytest.mark.parametrize("shape", sorted(ATTACK_FRAMES))
def test_a_one_mebibyte_frame_is_read_in_bounded_time(reader, shape):
    """Each 1 MiB attack shape is refused (or, skipping what it does not know, read) in
    well under the time the old reader took, building none of its million elements."""
    frame = msgspec.msgpack.encode(ATTACK_FRAMES[shape])
    assert len(frame) <= MIB + 64
    best = float("inf")
    for _ in range(3):  # the best of three: a shared machine may pause any one of them
        started = time.perf_counter()
        try:
            reader.read(frame)
        except BadFrame:
            pass
        best = min(best, time.perf_counter() - started)
    assert best < DECODE_BOUND_S, f"{shape}: {best * 1000:.0f} ms"


def test_refusals_are_told_apart(reader):
    """Not a map, an unknown type, a wrong field, and each list over its bound get their own code."""
    def code_of(obj) -> str:
        with pytest.raises(BadFrame) as refused:
            reader.read(msgspec.msgpack.encode(obj))
        return refused.value.code

    assert code_of([1, 2]) == "bad_frame" and code_of({"seq": 1}) == "bad_frame"
    assert code_of({"type": "nonsense"}) == "unknown_message" and code_of({"type": 5}) == "unknown_message"
    assert code_of({"type": "sync", "seq": "x", "tokens": []}) == "bad_field"
    assert code_of({"type": "sync", "seq": 1, "tokens": [1] * 4097}) == "context_full"
    assert code_of({"type": "verify", "seq": 1, "committed_len": 0, "append": [1] * 4097}) == "context_full"
    assert code_of({"type": "verify", "seq": 1, "committed_len": 0, "draft": [1] * 33}) == "draft_too_long"
    assert code_of({"type": "verify", "seq": 1, "committed_len": 0, "draft": [1],
                    "draft_dists": [[[1] * 1025, [0.1] * 1025]]}) == "bad_dists"
    assert code_of({"type": "generate", "seq": 1, "committed_len": 0, "stop_ids": [2] * 257}) == "bad_request"
    assert code_of({"type": "verify", "seq": 1, "committed_len": 0, "draft_source": "x" * 17}) == "bad_request"
    assert code_of({"type": "verify", "seq": 1, "committed_len": 0, "draft_source": "x" * MIB}) == "bad_request"
    with pytest.raises(BadFrame) as refused:
        reader.read(msgspec.msgpack.encode({"type": "sync", "seq": "x", "tokens": []}))
    assert refused.value.message.startswith("invalid sync message")
    with pytest.raises(BadFrame) as refused:  # a megabyte of type is quoted, cut short
        reader.read(msgspec.msgpack.encode({"type": "x" * MIB}))
    assert refused.value.code == "unknown_message" and len(refused.value.message) < 400


def test_frames_within_the_bounds_decode_to_the_wire_types(reader):
    """A history of the whole context, a full sampled draft and 256 stop ids are read as the
    wire's own message types (the rest of the service sees a Verify, a Sync, a Generate)."""
    verify = Verify(seq=1, committed_len=0, append=[1] * 4000, draft=[2] * 32,
                    draft_dists=[SparseDist(ids=list(range(64)), probs=[1 / 64] * 64)] * 32,
                    draft_source="n" * MAX_DRAFT_SOURCE_CHARS)
    for message in (verify, Sync(seq=1, tokens=[3] * 4096), Generate(seq=1, committed_len=0, stop_ids=[4] * 256)):
        read = reader.read(encode(message))
        assert isinstance(read, type(message)) and msgspec.to_builtins(read) == msgspec.to_builtins(message)


def test_a_frame_counts_one_request_per_four_kibibytes():
    """Small frames cost one request against the rate limit; a 1 MiB frame costs 256."""
    assert frame_cost(b"x") == 1 and frame_cost(b"x" * 4096) == 1 and frame_cost(b"x" * 4097) == 2
    assert frame_cost(b"x" * MIB) == 256
