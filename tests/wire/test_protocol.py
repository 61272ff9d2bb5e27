"""Wire messages round-trip; unknown or malformed frames are rejected by the decoder."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from wire.protocol import (
    MIN_TEMPERATURE, Hello, SamplingParams, SparseDist, Sync, Verdict, Verify, decode_client_message,
    decode_server_message, encode, vocab_fingerprint,
)


def test_messages_round_trip():
    """Each message decodes to what was encoded."""
    verify = Verify(seq=3, committed_len=10, append=[1], draft=[4, 5],
                    draft_dists=[SparseDist([4, 9], [0.75, 0.25]), SparseDist([5], [1.0])])
    assert decode_client_message(encode(verify)) == verify
    hello = Hello("ab" * 16, 320, 318, 319, SamplingParams(temperature=0.7, top_k=5, top_p=0.9), seed=4)
    assert decode_client_message(encode(hello)) == hello
    verdict = Verdict(seq=3, accepted=1, token=7, committed_len=12, forward_s=0.01)
    assert decode_server_message(encode(verdict)) == verdict


def test_bad_frames_raise_decode_errors():
    """Unknown tags, wrong types and garbage do not decode."""
    for frame in (b"\xc1", msgspec.msgpack.encode({"type": "nope"}),
                  msgspec.msgpack.encode({"type": "verify", "seq": "one", "committed_len": 0})):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            decode_client_message(frame)


def test_fingerprint_sees_any_change_of_token_text_or_order():
    """Changing, reordering or shifting bytes between tokens changes the fingerprint."""
    base = vocab_fingerprint([b"a", b"bc", b"d"])
    assert base != vocab_fingerprint([b"a", b"bd", b"d"])
    assert base != vocab_fingerprint([b"bc", b"a", b"d"])
    assert base != vocab_fingerprint([b"ab", b"c", b"d"])
    assert base == vocab_fingerprint([b"a", b"bc", b"d"])


def test_sampling_parameter_problems_are_named():
    """Invalid sampling parameters are described, valid ones pass."""
    assert SamplingParams(temperature=0.8, top_k=40, top_p=0.95).problems() == []
    problems = SamplingParams(temperature=-1, top_k=-2, top_p=0).problems()
    assert len(problems) == 3 and "temperature" in problems[0]


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-4, 0.000999])
def test_a_temperature_below_the_sampling_floor_is_refused_with_a_pointer_to_greedy(temperature):
    """A positive temperature under MIN_TEMPERATURE (a subnormal one included) is refused, naming 0 for greedy."""
    problems = SamplingParams(temperature=temperature).problems()
    assert len(problems) == 1 and "use 0 for greedy" in problems[0] and str(MIN_TEMPERATURE) in problems[0]
    with pytest.raises(ValueError):
        SamplingParams(temperature=temperature).checked()


def test_the_sampling_floor_and_greedy_are_accepted():
    """0 (greedy) and MIN_TEMPERATURE itself pass, and sample finite probabilities at the floor."""
    from wire.sampling import warp

    assert SamplingParams(temperature=0.0).problems() == []
    assert SamplingParams(temperature=MIN_TEMPERATURE).problems() == []
    probs = warp(np.array([1e4, -1e4, 3.0, 3.0 + 1e-3]), SamplingParams(temperature=MIN_TEMPERATURE))
    assert np.isfinite(probs).all() and probs[0] == 1.0


def test_a_sync_seed_round_trips_and_defaults_to_none():
    """Sync's appended seed field decodes, and a Sync without it (an older client) means no re-key."""
    assert decode_client_message(encode(Sync(seq=2, tokens=[1, 2], seed=2**64 - 1))).seed == 2**64 - 1
    old = msgspec.msgpack.encode({"type": "sync", "seq": 2, "tokens": [1, 2]})
    assert decode_client_message(old).seed is None
