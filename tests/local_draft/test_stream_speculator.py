"""The default mode (the service streams, the drafter guesses ahead) gives the target's text exactly."""

from __future__ import annotations

import pytest

from local_draft.server_only import ServerOnlyGenerator
from local_draft.stream_speculator import StreamSpeculator
from local_draft.verify_client import VerifyClient
from wire.protocol import Draft, Generate, Generated, SamplingParams
from tests.conftest import behind_round_trip, hello_for

PROMPTS = [
    "def quicksort(arr):", "The quick brown fox", "import numpy as np\n", "Once upon a time",
    "class Stack:\n    def push(self, x):", "SELECT * FROM users WHERE", "for i in range(10):",
    "Dear team,", "1, 2, 3, 5, 8,", "<html><body>", "éàü 中文 🎉", "x = [",
]
MAX_TOKENS = 40
SAMPLED = SamplingParams(temperature=0.9, top_k=20, top_p=0.95)
# Behind a few milliseconds of round trip the stream passes positions a chain guessed before the
# chain arrives: the service then checks those guesses against what it committed.
RTT_MS = 5


@pytest.fixture(scope="module")
def far_link(service_on):
    with behind_round_trip(service_on("llamacpp").url, RTT_MS) as url:
        yield url


def _server_only(url: str, draft, params: SamplingParams, prompts: list[str], seed: int | None = None) -> dict:
    client = VerifyClient(url, hello_for(draft, params, seed=seed))
    streamed = ServerOnlyGenerator(client, draft.end_ids)
    out = {}
    for prompt in prompts:
        if seed is not None:
            streamed.reseed(seed)
        out[prompt] = streamed.generate(draft.tokenize(prompt), MAX_TOKENS).token_ids
    client.close()
    return out


@pytest.mark.parametrize("drafter", ["close_draft", "far_draft"])
@pytest.mark.parametrize("k", [4, None], ids=["k4", "auto"])
def test_greedy_stream_is_token_identical_to_server_only(request, service, drafter, k):
    """Every prompt, both drafters, a fixed and the adaptive drafting: the tokens `--mode server` streams."""
    draft = request.getfixturevalue(drafter)
    reference = _server_only(service.url, draft, SamplingParams(), PROMPTS)
    client = VerifyClient(service.url, hello_for(draft))
    speculator = StreamSpeculator(draft, client, SamplingParams(), max_block=k)
    for prompt in PROMPTS:
        result = speculator.generate(draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == reference[prompt], prompt
    client.close()
    # Whether any guess is kept here depends on the machine: the tiny target alone passes a token
    # in about a millisecond and can outrun every guess. The paced service below holds its passes
    # to a GPU's, and there the kept guesses are counted and must be most of the text.


def test_behind_a_round_trip_guesses_for_passed_positions_are_checked(service_on, far_link, close_draft):
    """With 5 ms of round trip the stream runs ahead of the chains (their guesses for positions it
    passed are compared with what it committed): still the server's tokens."""
    reference = _server_only(service_on("llamacpp").url, close_draft, SamplingParams(), PROMPTS)
    client = VerifyClient(far_link, hello_for(close_draft))
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=4)
    guessed = 0
    for prompt in PROMPTS:
        result = speculator.generate(close_draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == reference[prompt], prompt
        guessed += result.stats.ahead_drafted
    client.close()
    assert guessed > len(PROMPTS)


def test_on_a_gpu_like_device_most_tokens_are_kept_guesses(paced_service, close_draft):
    """Passes held to 4 ms (a GPU's, emulated), the close drafter guessing: the server's tokens, in
    well under one pass a token, most of them guesses the service kept."""
    reference = _server_only(paced_service.url, close_draft, SamplingParams(), PROMPTS)
    client = VerifyClient(paced_service.url, hello_for(close_draft))
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=8)
    made = passes = accepted = 0
    for prompt in PROMPTS:
        result = speculator.generate(close_draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == reference[prompt], prompt
        made, passes, accepted = made + len(result.token_ids), passes + result.stats.rounds, accepted + result.stats.accepted
    client.close()
    assert passes < 0.6 * made and accepted > 0.4 * made, (passes, accepted, made)


def test_guesses_stop_at_the_end_of_the_reply(paced_service, close_draft, monkeypatch):
    """A reply of a few tokens on a GPU-like device, the drafter allowed 8 guesses ahead: every
    reply is guessed, and no guess is made for a position past the reply's last token (the stream
    ends there; the drafter's time would be lost)."""
    furthest = []
    true_send = StreamSpeculator._send

    def recording_send(self, client, seq, chain):
        furthest.append(chain.start + chain.levels)
        return true_send(self, client, seq, chain)

    monkeypatch.setattr(StreamSpeculator, "_send", recording_send)
    client = VerifyClient(paced_service.url, hello_for(close_draft))
    # a GPU elsewhere (colocated=False): the drafter guesses from the prompt's pass on
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), max_block=8, colocated=False)
    reply_tokens = 4
    for prompt in PROMPTS:
        ids = close_draft.tokenize(prompt)
        furthest.clear()
        speculator.generate(ids, reply_tokens)
        assert furthest and max(furthest) <= len(ids) + reply_tokens, (prompt, max(furthest, default=None))
    client.close()


def test_a_replys_request_goes_out_before_its_drafting_decisions(service_on, close_draft, monkeypatch):
    """The controller's decisions for a reply (whether to draft, how wide: a millisecond of arithmetic)
    are made after the Generate is sent, not before: they change nothing it asks, and the first token
    is a round trip away. Each reply, default flags: the request, then the decision, once."""
    from local_draft.stream_controller import StreamController

    events = []
    true_new_reply, true_send_generate = StreamController.new_reply, VerifyClient.send_generate
    monkeypatch.setattr(StreamController, "new_reply", lambda self: (events.append("decide"), true_new_reply(self)))
    monkeypatch.setattr(VerifyClient, "send_generate",
                        lambda self, request: (events.append("generate"), true_send_generate(self, request)))
    client = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), seed=5)
    for prompt in PROMPTS[:3]:
        events.clear()
        result = speculator.generate(close_draft.tokenize(prompt), 8)
        assert result.token_ids and events == ["generate", "decide"], (prompt, events)
    client.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_seeded_sampled_stream_is_token_identical_to_seeded_server_only(paced_service, close_draft, seed):
    """Sampling with a seed: the stream with guesses commits exactly the tokens the stream alone
    does (the target's race decides every position, guesses only how many a pass commits)."""
    url = paced_service.url
    reference = _server_only(url, close_draft, SAMPLED, PROMPTS, seed=seed)
    client = VerifyClient(url, hello_for(close_draft, SAMPLED, seed=seed))
    speculator = StreamSpeculator(close_draft, client, SAMPLED, seed=seed, max_block=4)
    accepted = drafted = 0
    for prompt in PROMPTS:
        speculator.reseed(seed)
        result = speculator.generate(close_draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == reference[prompt], prompt
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    client.close()
    assert drafted >= 20 and accepted / drafted > 0.5, (accepted, drafted)  # the coupled guesses were mostly right


def test_a_client_that_guesses_garbage_changes_the_speed_not_the_text(service_on, close_draft):
    """Raw Draft frames at wrong positions, with random tokens, in chains that skip about: the
    streamed tokens are still the target's alone (greedy and seeded sampling)."""
    url = service_on("llamacpp").url
    prompt = close_draft.tokenize("def quicksort(arr):")
    for params, seed in ((SamplingParams(), None), (SAMPLED, 9)):
        expected = _server_only(url, close_draft, params, ["def quicksort(arr):"], seed=seed)["def quicksort(arr):"]
        client = VerifyClient(url, hello_for(close_draft, params, seed=seed))
        client.send_generate(Generate(seq=1, committed_len=0, append=prompt, max_tokens=MAX_TOKENS,
                                      stop_ids=sorted(close_draft.end_ids)))
        made, chain = [], 0
        while True:
            frame = client.receive_generated()
            assert isinstance(frame, Generated)
            made += frame.tokens
            if frame.done:
                break
            at = len(prompt) + len(made)
            chain += 1
            # a chain a token behind, one right on, one ahead of where a client could know: all guesses wrong or right by chance
            for start, tokens in ((at - 1, [made[-1] if made else 0, 7, 7]), (at, [expected[len(made)] if
                                  len(made) < len(expected) else 3, 5]), (at + 3, [1, 2, 3])):
                client.send_draft(Draft(seq=1, chain=chain, start=start, tokens=tokens, source="model"))
                chain += 1
        client.close()
        assert made == expected


def test_a_stop_token_guessed_and_kept_ends_the_stream_there(service_on, close_draft):
    """A guess equal to the target's end token is kept, and nothing of the target's follows it."""
    url = service_on("llamacpp").url
    prompt = close_draft.tokenize("The quick brown fox")
    expected = _server_only(url, close_draft, SamplingParams(), ["The quick brown fox"])["The quick brown fox"]
    stop = expected[5]  # say the sixth token were the end of the text
    client = VerifyClient(url, hello_for(close_draft))
    client.send_generate(Generate(seq=1, committed_len=0, append=prompt, max_tokens=MAX_TOKENS, stop_ids=[stop]))
    first = client.receive_generated()
    client.send_draft(Draft(seq=1, chain=1, start=len(prompt) + len(first.tokens),
                            tokens=expected[len(first.tokens):8]))
    made = list(first.tokens)
    while not (frame := client.receive_generated()).done:
        made += frame.tokens
    made += frame.tokens
    client.close()
    assert made == expected[:expected.index(stop) + 1] and frame.stop_reason == "eos"


def test_the_drafter_rests_where_the_service_cannot_gain(service_on, close_draft):
    """A service whose passes cost a step per token (told in the Welcome) makes the drafter rest:
    no guesses, the stream alone."""
    from wire.protocol import PassCost

    client = VerifyClient(service_on("llamacpp").url, hello_for(close_draft))
    client.welcome.pass_costs = [PassCost(tokens=n, ms=60.0 * n) for n in (1, 2, 4, 8, 16, 32)]
    speculator = StreamSpeculator(close_draft, client, SamplingParams())
    result = speculator.generate(close_draft.tokenize("def quicksort(arr):"), MAX_TOKENS)
    client.close()
    assert result.stats.ahead_drafted == 0 and result.stats.drafted == 0
    assert len(result.token_ids) == MAX_TOKENS


@pytest.mark.parametrize("colocated", [True, False], ids=["same-machine", "elsewhere"])
def test_a_fresh_drafter_beside_a_cpu_service_on_its_cores_does_not_probe(paced_service, close_draft, monkeypatch,
                                                                          colocated):
    """A fresh state, a curve whose blocks are cheaper per token than steps (a CPU service's): a
    drafter working every core of the service's machine would leave its passes a quarter of them,
    so it never starts; the same drafter beside a service elsewhere probes (the gain is measured).
    The drafter's thread count is set here, not its llama.cpp threads: the price reads only it.
    The service's passes are paced (4 ms): the tiny target alone streams faster than a busy
    machine's client reads, and a client with frames waiting reads them before it guesses."""
    from wire.protocol import PassCost
    from wire.threads import physical_cores

    monkeypatch.setattr(close_draft, "n_threads", physical_cores())
    client = VerifyClient(paced_service.url, hello_for(close_draft))
    client.welcome.pass_costs = [PassCost(tokens=n, ms=60.0 + 35.0 * (n - 1)) for n in (1, 2, 4, 8, 16, 32)]
    speculator = StreamSpeculator(close_draft, client, SamplingParams(), colocated=colocated)
    result = speculator.generate(close_draft.tokenize("def quicksort(arr):"), MAX_TOKENS)
    client.close()
    assert len(result.token_ids) == MAX_TOKENS
    if colocated:
        assert speculator.controller.drafter_share == 1.0 and speculator.controller.interference == 4.0
        assert result.stats.ahead_drafted == 0
    else:
        assert speculator.controller.drafter_share == 0.0
        assert result.stats.ahead_drafted > 0  # a probe (its passes' slowdown is measured from then on)


@pytest.mark.parametrize("rewind", [True, False], ids=["rewind", "older-service"])
@pytest.mark.parametrize("mode", ["default", "server"])
def test_a_new_conversation_on_an_open_session_waits_for_no_sync(service_on, far_link, close_draft, mode, rewind):
    """Each prompt a new conversation on one connection, each with its own seed: the Generate keeps
    what the histories share and re-keys itself, so no Sync's round trip comes before a first token,
    and every reply is the one a fresh connection with that seed gets. A service that does not
    offer it (its Welcome without "rewind", as an older one sends) gets a Sync first, as before."""
    prompts = PROMPTS[:4]
    reference = {prompt: _server_only(service_on("llamacpp").url, close_draft, SAMPLED, [prompt], seed=50 + i)[prompt]
                 for i, prompt in enumerate(prompts)}
    client = VerifyClient(far_link, hello_for(close_draft, SAMPLED, seed=7))
    if not rewind:
        client.welcome.capabilities.remove("rewind")  # the real service, told to be taken for an older one
    if mode == "default":
        generator = StreamSpeculator(close_draft, client, SAMPLED, seed=7, max_block=4)
    else:
        generator = ServerOnlyGenerator(client, close_draft.end_ids)
    for i, prompt in enumerate(prompts):
        generator.reseed(50 + i)
        result = generator.generate(close_draft.tokenize(prompt), MAX_TOKENS)
        assert result.token_ids == reference[prompt], prompt
        assert result.stats.syncs == (0 if rewind else 1), (prompt, result.stats.syncs)
    client.close()
