"""The sans-I/O session on the tiny target: commits, KV roll back, and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from wire.limits import MAX_STOP_IDS
from wire.protocol import Generate, SamplingParams, Sync, Verify
from remote_verify.session import Session, SessionError, SessionLimits

PROMPT = [318, 100, 101, 102, 103]


def _session(backend, **sampling) -> Session:
    return Session(backend, SamplingParams(**sampling), seed=0, limits=SessionLimits(max_draft=8, max_context=256))


def _fresh_logits(backend, tokens: list[int]) -> np.ndarray:
    """Logits after `tokens`, computed from scratch with an empty cache."""
    return backend.forward(backend.new_cache(), tokens, n_logits=1)[0]


def _greedy_continuation(backend, tokens: list[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(int(_fresh_logits(backend, tokens + out).argmax()))
    return out


@pytest.mark.parametrize("n_right", [0, 2, 4])
def test_rollback_after_zero_partial_and_full_acceptance(target, n_right):
    """After any acceptance, the cache continues exactly like a recompute from scratch."""
    session = _session(target)
    truth = _greedy_continuation(target, PROMPT, 6)
    wrong = [(t + 1) % 300 for t in truth]
    draft = truth[:n_right] + wrong[n_right:4]
    verdict = session.verify(Verify(seq=1, committed_len=0, append=PROMPT, draft=draft))
    assert verdict.accepted == n_right
    assert verdict.token == truth[n_right]
    assert session.committed == PROMPT + truth[: n_right + 1]
    assert session.cached_len == len(session.committed) - 1
    # The next round must see the same logits as a model that never saw the rejected tokens.
    after = session.verify(Verify(seq=2, committed_len=len(session.committed), draft=[]))
    assert after.token == truth[n_right + 1]
    cached = target.forward(session.cache, session.committed[session.cached_len:], n_logits=1)[0]
    np.testing.assert_allclose(cached, _fresh_logits(target, session.committed), atol=1e-4)


def test_refusals_leave_the_session_unchanged(target):
    """Bad sequence numbers, stale lengths and out-of-range ids are refused without side effects."""
    session = _session(target)
    session.verify(Verify(seq=1, committed_len=0, append=PROMPT, draft=[]))
    before = (list(session.committed), session.cached_len, session.last_seq)
    cases = [
        (Verify(seq=5, committed_len=len(PROMPT) + 1), "bad_seq"),
        (Verify(seq=2, committed_len=3), "stale_state"),
        (Verify(seq=2, committed_len=len(PROMPT) + 1, draft=[target.vocab_size]), "bad_token"),
        (Verify(seq=2, committed_len=len(PROMPT) + 1, append=[-1]), "bad_token"),
        (Verify(seq=2, committed_len=len(PROMPT) + 1, draft=[1] * 9), "draft_too_long"),
        (Verify(seq=2, committed_len=len(PROMPT) + 1, append=[1] * 300), "context_full"),
    ]
    for request, code in cases:
        with pytest.raises(SessionError) as error:
            session.verify(request)
        assert error.value.code == code, error.value.message
        assert (session.committed, session.cached_len, session.last_seq) == before


def test_sampling_needs_a_valid_draft_distribution(target):
    """Sampled drafts without, or outside, their distribution are refused."""
    from wire.protocol import SparseDist

    session = _session(target, temperature=1.0)
    with pytest.raises(SessionError, match="one draft distribution per draft token"):
        session.verify(Verify(seq=1, committed_len=0, append=PROMPT, draft=[5]))
    with pytest.raises(SessionError, match="no mass"):
        session.verify(Verify(seq=1, committed_len=0, append=PROMPT, draft=[5],
                              draft_dists=[SparseDist(ids=[6], probs=[1.0])]))
    verdict = session.verify(Verify(seq=1, committed_len=0, append=PROMPT, draft=[5],
                                    draft_dists=[SparseDist(ids=[5, 6], probs=[0.5, 0.5])]))
    assert verdict.committed_len == len(PROMPT) + 1 + verdict.accepted


def test_sync_keeps_the_shared_prefix(target):
    """Sync adopts the client's history and keeps the cached prefix both share."""
    session = _session(target)
    session.verify(Verify(seq=1, committed_len=0, append=PROMPT, draft=[1, 2, 3]))
    new_history = PROMPT[:3] + [7, 8]
    synced = session.sync(Sync(seq=9, tokens=new_history))
    assert synced.committed_len == 5 and session.committed == new_history
    assert session.cached_len == 3
    verdict = session.verify(Verify(seq=10, committed_len=5, draft=[]))
    assert verdict.token == int(_fresh_logits(target, new_history).argmax())


def test_a_generate_that_keeps_part_of_the_history_continues_like_a_fresh_session(target):
    """Generate(keep=k) drops the committed tokens past k and their cache, appends the new ones,
    and the stream goes on exactly as a fresh session given the new history would."""
    session = _session(target)
    session.start_generation(Generate(seq=1, committed_len=0, append=PROMPT))
    for _ in range(4):
        session.generate_step()
    assert len(session.committed) == 9 and session.cached_len >= 8
    new_history = PROMPT[:3] + [7, 8]
    session.start_generation(Generate(seq=2, committed_len=9, keep=3, append=[7, 8]))
    assert session.committed == new_history and session.cached_len == 3
    made = [session.generate_step()[0] for _ in range(3)]
    assert made == _greedy_continuation(target, new_history, 3)


@pytest.mark.parametrize("keep, seed, code", [(6, None, "bad_request"), (-2, None, "bad_request"),
                                              (2, -1, "bad_seed")])
def test_a_generate_with_a_bad_keep_or_seed_is_refused_unchanged(target, keep, seed, code):
    """keep past the committed history, keep below -1, a seed outside 64 bits: refused, nothing changed."""
    session = _session(target, temperature=1.0)
    session.start_generation(Generate(seq=1, committed_len=0, append=PROMPT))
    before = (list(session.committed), session.cached_len, session.randomness.seed, session.last_seq)
    with pytest.raises(SessionError) as error:
        session.start_generation(Generate(seq=2, committed_len=5, keep=keep, seed=seed, append=[9]))
    assert error.value.code == code
    assert (session.committed, session.cached_len, session.randomness.seed, session.last_seq) == before


def _sampled_rounds(session: Session, history: list[int], blocks: list[list[int]], seq: int = 1) -> list[tuple]:
    """Verify each block (every draft token given all the mass: always drafted "from" a point
    mass, so acceptance is p(x)) after `history`; returns (accepted, token) per round."""
    from wire.protocol import SparseDist

    verdicts, committed = [], len(session.committed)
    append = history[committed:]
    for block in blocks:
        verdict = session.verify(Verify(seq=seq, committed_len=committed, append=append, draft=block,
                                        draft_dists=[SparseDist(ids=[t], probs=[1.0]) for t in block]))
        verdicts.append((verdict.accepted, verdict.token))
        seq, committed, append = seq + 1, verdict.committed_len, []
    return verdicts


def test_a_rebuilt_session_draws_what_the_first_one_drew(torch_target):
    """Same seed, same history: a new session (a reconnect, another replica) decides the same, and
    a session that saw other text first and was synced back decides the same too."""
    blocks = [[100, 101, 102], [5, 6], [], [7, 8, 9, 10]]
    limits = SessionLimits(max_draft=8, max_context=256)
    first = Session(torch_target, SamplingParams(temperature=1.0), seed=11, limits=limits)
    decided = _sampled_rounds(first, PROMPT, blocks)
    rebuilt = Session(torch_target, SamplingParams(temperature=1.0), seed=11, limits=limits)
    assert _sampled_rounds(rebuilt, PROMPT, blocks) == decided
    detoured = Session(torch_target, SamplingParams(temperature=1.0), seed=11, limits=limits)
    _sampled_rounds(detoured, PROMPT + [40, 41, 42], blocks)  # other positions, other draws
    detoured.sync(Sync(seq=20, tokens=PROMPT))
    assert _sampled_rounds(detoured, PROMPT, blocks, seq=21) == decided
    rekeyed = Session(torch_target, SamplingParams(temperature=1.0), seed=12, limits=limits)
    rekeyed.sync(Sync(seq=1, tokens=PROMPT, seed=11))  # a Sync's seed re-keys like a Hello's
    assert _sampled_rounds(rekeyed, PROMPT, blocks, seq=2) == decided
    rewound = Session(torch_target, SamplingParams(temperature=1.0), seed=12, limits=limits)
    _sampled_rounds(rewound, PROMPT + [40, 41, 42], blocks)
    rewound.start_generation(Generate(seq=5, committed_len=len(rewound.committed), keep=3, append=PROMPT[3:],
                                      seed=11))  # a Generate's keep and seed do what a Sync does
    assert _sampled_rounds(rewound, PROMPT, blocks, seq=6) == decided
    others = [_sampled_rounds(Session(torch_target, SamplingParams(temperature=1.0), seed=s, limits=limits),
                              PROMPT, blocks) for s in range(5)]
    assert any(other != decided for other in others)


def test_a_server_only_token_is_keyed_by_its_position(torch_target):
    """generate_step draws the token at position n from (seed, n): a rebuilt session repeats it."""
    from wire.protocol import Generate

    def stream(seed: int) -> list[int]:
        session = Session(torch_target, SamplingParams(temperature=1.0), seed=seed,
                          limits=SessionLimits(max_draft=8, max_context=256))
        session.start_generation(Generate(seq=1, committed_len=0, append=PROMPT))
        return [session.generate_step()[0] for _ in range(12)]

    assert stream(3) == stream(3)
    assert len({tuple(stream(s)) for s in range(4)}) > 1


def test_a_sync_with_a_seed_outside_64_bits_is_refused_unchanged(torch_target):
    """Sync(seed=-1) is a bad_seed error and leaves history and randomness as they were."""
    session = _session(torch_target, temperature=1.0)
    session.verify(Verify(seq=1, committed_len=0, append=PROMPT, draft=[]))
    before = (list(session.committed), session.randomness.seed, session.last_seq)
    with pytest.raises(SessionError) as error:
        session.sync(Sync(seq=2, tokens=PROMPT, seed=-1))
    assert error.value.code == "bad_seed"
    assert (session.committed, session.randomness.seed, session.last_seq) == before


def test_requests_over_a_limit_are_refused_by_length_before_their_ids_are_read(llamacpp_target):
    """A history or draft over its limit, full of out-of-range ids, is refused for its length
    (context_full, draft_too_long, too many stop_ids), not for an id: the length is checked
    first, so a long request costs no scan of what it holds."""
    session = _session(llamacpp_target)
    bad = llamacpp_target.vocab_size + 7
    with pytest.raises(SessionError) as refused:
        session.sync(Sync(seq=1, tokens=[bad] * 300))
    assert refused.value.code == "context_full"
    with pytest.raises(SessionError) as refused:
        session.verify(Verify(seq=1, committed_len=0, append=[bad] * 300))
    assert refused.value.code == "context_full"
    with pytest.raises(SessionError) as refused:
        session.verify(Verify(seq=1, committed_len=0, append=[1], draft=[bad] * 9))
    assert refused.value.code == "draft_too_long"
    with pytest.raises(SessionError) as refused:
        session.start_generation(Generate(seq=1, committed_len=0, append=[1], stop_ids=[bad] * (MAX_STOP_IDS + 1)))
    assert refused.value.code == "bad_request" and str(MAX_STOP_IDS) in refused.value.message
    with pytest.raises(SessionError) as refused:  # within the limits, the id is what is wrong
        session.verify(Verify(seq=1, committed_len=0, append=[1, bad]))
    assert refused.value.code == "bad_token" and str(bad) in refused.value.message


def test_a_stream_pass_queued_behind_the_close_is_refused_not_run_on_a_freed_cache(llamacpp_target):
    """A stream's next pass can reach the device after its session's close (queued behind it); planned
    on the freed cache it failed the whole shared pass it had joined. It is refused as closed instead."""
    session = _session(llamacpp_target)
    session.committed = [5, 6, 7]
    work = session.stream_work()
    session.close()
    with pytest.raises(SessionError) as refused:
        work.plan(None)
    assert refused.value.code == "closed"
