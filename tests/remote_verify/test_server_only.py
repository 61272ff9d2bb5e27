"""Server-only generation through the real service: the target's own tokens, streamed and cancellable."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from websockets.sync.client import connect

from local_draft.server_only import ServerOnlyGenerator
from local_draft.service_link import ServiceLink
from local_draft.speculator import Speculator
from local_draft.verify_client import VerifyClient, VerifyError
from wire.protocol import (
    SUBPROTOCOL, Cancel, Error, Generate, Generated, SamplingParams, Verdict, Verify, Welcome, decode_server_message, encode,
)
from wire.sampling import warp
from tests.conftest import hello_for
from tests.forked_seeds import map_seeds, service_here
from tests.local_draft.test_fallback import FAST_BACKOFF, start_service, target_alone
from tests.statistics import ALPHA, chi_square_pvalue

PROMPTS = ["def quicksort(arr):", "The quick brown fox", "éàü 中文 🎉"]


def test_server_only_tokens_are_the_target_alone(service, close_draft):
    """Greedy server-only streaming gives exactly the tokens of k = 0, one target pass per token."""
    client = VerifyClient(service.url, hello_for(close_draft))
    alone = Speculator(close_draft, client, SamplingParams(), k=0)
    streamed = ServerOnlyGenerator(client, close_draft.end_ids)
    for prompt in PROMPTS:
        ids = close_draft.tokenize(prompt)
        expected = alone.generate(ids, 60)
        result = streamed.generate(ids, 60)
        assert result.token_ids == expected.token_ids, prompt
        assert result.stop_reason == expected.stop_reason
        assert result.stats.verified_rounds == len(result.token_ids)  # one forward pass per token
        assert result.stats.forward_s > 0 and result.stats.first_token_s is not None
    client.close()


def test_a_cancelled_stream_keeps_its_tokens_and_the_session_goes_on(service, close_draft):
    """Cancel after 10 tokens: the stream ends "stopped" with what it made; the next round continues it."""
    client = VerifyClient(service.url, hello_for(close_draft))
    streamed = ServerOnlyGenerator(client, close_draft.end_ids)
    ids = close_draft.tokenize("import numpy as np\n")
    full = streamed.generate(ids, 200).token_ids
    partial = streamed.generate(ids, 200, should_stop=lambda: streamed.stats.generated >= 10)
    assert partial.stop_reason == "stopped" and 10 <= len(partial.token_ids) < 200
    assert partial.token_ids == full[: len(partial.token_ids)]
    session = service.service.sessions[client.welcome.session_id]
    assert session.committed == ids + partial.token_ids
    rest = Speculator(close_draft, client, SamplingParams(), k=4).generate(ids + partial.token_ids, 20)
    assert rest.token_ids == full[len(partial.token_ids): len(partial.token_ids) + 20]
    client.close()


def test_requests_during_a_stream_and_bad_generates_are_refused_clearly(service, close_draft):
    """A Verify while streaming gets "busy"; max_tokens 0 gets "bad_request"; the stream goes on until
    cancelled, and the session stays intact."""
    with connect(service.url, subprotocols=[SUBPROTOCOL]) as ws:
        ws.send(encode(hello_for(close_draft)))
        assert isinstance(decode_server_message(ws.recv()), Welcome)
        ws.send(encode(Generate(seq=1, committed_len=0, append=[1, 2, 3], max_tokens=0)))
        reply = decode_server_message(ws.recv())
        assert isinstance(reply, Error) and reply.code == "bad_request" and "max_tokens" in reply.message
        # far more tokens than the stream can make while one frame crosses the socket, so the
        # Verify is read while it streams however fast the machine is; a Cancel ends it
        ws.send(encode(Generate(seq=1, committed_len=0, append=[1, 2, 3], max_tokens=2000)))
        frames = [decode_server_message(ws.recv(timeout=30))]
        assert isinstance(frames[0], Generated) and not frames[0].done
        ws.send(encode(Verify(seq=2, committed_len=4, draft=[5])))
        errors = []
        while not errors:
            message = decode_server_message(ws.recv(timeout=30))
            (frames if isinstance(message, Generated) else errors).append(message)
        assert [e.code for e in errors] == ["busy"] and "cancel" in errors[0].message
        ws.send(encode(Cancel(seq=1)))
        while not frames[-1].done:
            message = decode_server_message(ws.recv(timeout=30))
            assert isinstance(message, Generated), message
            frames.append(message)
        made = sum(len(f.tokens) for f in frames)
        assert frames[-1].stop_reason == "cancelled" and 1 <= made < 2000
        ws.send(encode(Verify(seq=2, committed_len=3 + made, draft=[])))  # the session is intact
        assert isinstance(decode_server_message(ws.recv(timeout=30)), Verdict)


STREAM_SAMPLES = 10_000  # one warp and one draw per token, no acceptance rule: gross errors are all it can have


def test_sampled_server_only_tokens_follow_the_target_distribution(service_on, close_draft):
    """The first streamed token of sampled generations fits the target's exact distribution."""
    service = service_on("llamacpp")
    params = SamplingParams(temperature=1.0, top_k=8)
    prompt = close_draft.tokenize("The")
    exact = warp(service.backend.forward(service.backend.new_cache(), prompt, n_logits=1)[0], params)

    def first_tokens(seeds: range) -> list[int]:
        with service_here(service) as url:
            client = VerifyClient(url, hello_for(close_draft, params, seed=7))
            streamed = ServerOnlyGenerator(client, close_draft.end_ids)
            made = []
            for seed in seeds:
                streamed.reseed(seed)  # a seed decides the token: each sample gets its own
                made.append(streamed.generate(prompt, 1).token_ids[0])
            client.close()
        return made

    counts = np.zeros_like(exact, dtype=np.int64)
    for token in map_seeds(first_tokens, range(STREAM_SAMPLES)):
        counts[token] += 1
    assert chi_square_pvalue(counts, exact) > ALPHA


def test_a_wrong_history_length_is_refused_then_rebuilt(service, close_draft):
    """Generate with a stale committed length is an error the generator answers with Sync."""
    client = VerifyClient(service.url, hello_for(close_draft))
    with pytest.raises(VerifyError) as error:
        client.send_generate(Generate(seq=1, committed_len=5, append=[1]))
        client.receive_generated()
    assert error.value.code == "stale_state" and "Sync" in str(error.value)
    streamed = ServerOnlyGenerator(client, close_draft.end_ids)
    streamed._service_history = [9, 9, 9]  # a belief the service does not share
    assert len(streamed.generate(close_draft.tokenize("hello"), 5).token_ids) == 5
    client.close()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["drain", "kill"])
def test_a_stream_cut_by_the_service_going_away_resumes_where_it_stopped(tiny, llamacpp_target, close_draft,
                                                                        stop_signal):
    """SIGTERM (the stream's last frame says going_away) or SIGKILL mid-stream, then a restart:
    the server-only client reconnects, the new session is rebuilt, and the reply is whole."""
    process, port = start_service(tiny.target_gguf)
    link = ServiceLink(f"ws://127.0.0.1:{port}", hello_for(close_draft), backoff=FAST_BACKOFF)
    streamed = ServerOnlyGenerator(link, close_draft.end_ids)
    made: list[int] = []

    def on_commit(tokens: list[int], provenance: list[str]) -> None:
        nonlocal process
        made.extend(tokens)
        if len(made) >= 20 and link.connections == 1 and process.poll() is None:
            process.send_signal(stop_signal)
            process.wait(timeout=60)
            process, _ = start_service(tiny.target_gguf, port)

    prompt = close_draft.tokenize("def quicksort(arr):")
    try:
        result = streamed.generate(prompt, 80, on_commit)
    finally:
        link.close()
        process.kill()
    assert result.stop_reason == "max_tokens" and len(result.token_ids) == 80
    assert result.token_ids == target_alone(llamacpp_target, prompt, 80)
    assert link.connections == 2 and result.stats.round_trips == 2  # a new session takes the whole history
