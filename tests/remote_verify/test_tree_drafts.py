"""Trees of guesses through the real protocol: the stream's text is the target's, whatever the tree.

Each test streams a Generate with trees built from the target's own text (computed here beforehand
by the backend itself, a token a pass): one tree for the whole stream sent with the Generate, and
a short one after every frame. At each level the right token is the third child, after a wrong
one and a trap (the target's pick after that wrong one: what a bug reading a child's row from
its sibling would keep), and a wrong branch hangs below the first wrong node. A backend with tree
attention keeps the right branches; one without verifies the first-choice path, all wrong, and
keeps none. The text must be the target's alone either way (greedy, and seeded sampling: a
function of the seed), three planted bugs of a tree's verification must each change it, and a
malformed tree is refused with what is wrong.
"""

from __future__ import annotations

import asyncio

import pytest
from websockets.sync.client import connect

from local_draft.verify_client import VerifyClient
from remote_verify import session as session_module
from remote_verify.session import Session
from wire.draft_tree import ROOT, GuessTree
from wire.protocol import (
    SUBPROTOCOL, Cancel, Draft, Error, Generate, Generated, Hello, SamplingParams, Welcome, decode_server_message,
    encode, vocab_fingerprint,
)
from wire.randomness import DecisionRandomness
from wire.sampling import race_choice, warp
from tests.conftest import RunningService

PROMPT = [1, 72, 101, 108, 108, 111, 44]  # token ids: BOS and a few bytes' tokens
TOKENS = 24  # per stream: a few tree passes each
SAMPLED = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
SEED = 11
# the emulated device's pass: a tree sent after a frame is in time for the next pass, on a loaded machine
# too (at 15 ms a suite's load made the client's tree late for half the passes)
TREE_PASS_MS = 40.0
# Kept guesses that show the trees were walked: with no walk, none is kept (every first child is a
# trap). A tree answers each frame over the loopback inside a pass when the machine is quiet (13
# of 24 kept, greedy and sampled); under the full suite's load some come a pass late (11 seen once).
KEPT_AT_LEAST = 6


def _pick(target, logits, params: SamplingParams, randomness: DecisionRandomness, position: int) -> int:
    """The target's token at `position` from its logits there: the argmax, or the race of (seed, position)."""
    if params.greedy:
        return int(logits.argmax())
    probs = warp(logits, params)
    return race_choice(probs, randomness.race(position, probs.shape[0]))


def target_alone(target, prompt: list[int], n: int, params: SamplingParams = SamplingParams(),
                 seed: int | None = None) -> list[int]:
    """The target's own text, a token a pass: its argmax, or its race over the clocks of (seed, position)."""
    randomness = DecisionRandomness(seed)
    cache, made = target.new_cache(), []
    logits = target.forward(cache, prompt, 1)[-1]
    for _ in range(n):
        made.append(_pick(target, logits, params, randomness, len(prompt) + len(made)))
        logits = target.forward(cache, [made[-1]], 1)[-1]
    return made


def on_device(service: RunningService, work):
    """`work()` run on the service's device thread, in a turn of its own: a backend is used from that
    thread only (a llama.cpp pool that grows under a pass of another thread is lost)."""
    running = service.service
    return asyncio.run_coroutine_threadsafe(running.queue.run("tests", work), running._loop).result(60)[0]


def wrong(token: int, vocab: int, by: int = 1) -> int:
    return (token + by) % vocab


def traps(target, prompt: list[int], expected: list[int], params: SamplingParams, seed: int | None) -> list[int]:
    """For each position i: the target's pick after the text up to i with a wrong token at i, the
    token a bug reading a child's row from the sibling before it would keep."""
    randomness = DecisionRandomness(seed)
    found = []
    for i, token in enumerate(expected):
        history = prompt + expected[:i] + [wrong(token, target.vocab_size)]
        found.append(_pick(target, target.forward(target.new_cache(), history, 1)[-1], params, randomness,
                           len(history)))
    return found


def oracle_tree(right: list[int], trap: list[int], vocab: int) -> GuessTree:
    """Guesses for the next len(right) tokens, `right` being the target's: at each level a wrong
    first child, then the trap (the target's pick after that wrong child), then the right token,
    whose children make the next level; a wrong branch hangs under the first wrong node. The right
    path is every level's third child; the first-choice path, two wrong nodes."""
    tokens, parents, above = [], [], ROOT
    for level, token in enumerate(right):
        tokens += [wrong(token, vocab), trap[level] if level < len(trap) else wrong(token, vocab, 3), token]
        parents += [above, above, above]
        above = len(tokens) - 1
        if level == 0:  # under node 0, the first wrong guess
            tokens.append(wrong(right[1] if len(right) > 1 else token, vocab, 2))
            parents.append(0)
    return GuessTree(tokens, parents)


def hello(target, params: SamplingParams, seed: int | None) -> Hello:
    """A Hello for the target's own vocabulary: these tests send guesses of their own, no drafter's."""
    return Hello(vocab_fingerprint(target.token_texts()), target.vocab_size, target.bos_id, target.eos_id, params,
                 seed=seed, client="tests")


def stream_with_trees(service: RunningService, prompt: list[int], expected: list[int], params: SamplingParams,
                      seed: int | None, trees: bool = True) -> tuple[list[int], int, bool]:
    """Stream TOKENS tokens, sending an oracle tree (or none) after each frame; returns the tokens,
    how many were kept guesses, and what the Welcome said of trees."""
    trap = on_device(service, lambda: traps(service.backend, prompt, expected, params, seed))
    client = VerifyClient(service.url, hello(service.backend, params, seed))
    client.send_generate(Generate(seq=1, committed_len=0, append=prompt, max_tokens=TOKENS))
    vocab = service.backend.vocab_size
    made, accepted, chain = [], 0, 1
    if trees:  # one tree for the whole stream, sent at once: whenever it arrives, the passes walk it
        tree = oracle_tree(expected, trap, vocab)
        client.send_draft(Draft(seq=1, chain=chain, start=len(prompt), tokens=tree.tokens, parents=tree.parents))
    while True:
        frame = client.receive_generated()
        assert isinstance(frame, Generated)
        made += frame.tokens
        accepted += frame.accepted
        if frame.done:
            break
        if trees:
            chain += 1
            at = len(made)
            tree = oracle_tree(expected[at:at + 4] or [0], trap[at:at + 4], vocab)  # replaces the one before
            client.send_draft(Draft(seq=1, chain=chain, start=len(prompt) + len(made), tokens=tree.tokens,
                                    parents=tree.parents, source="model"))
    said = client.welcome.trees
    client.close()
    return made, accepted, said


@pytest.fixture(scope="module")
def emulated_torch(tiny):
    """The tiny torch target on the emulated device: passes of TREE_PASS_MS, for 1 node or 64. A
    target of its own: `torch_target` is served by `service_on("torch")`."""
    from benchmarks.emulation.profiles import TargetProfile
    from benchmarks.emulation.target import EmulatedTarget
    from remote_verify.backends.torch_backend import TorchTarget

    profile = TargetProfile(name="tests-trees", pass_points=((1, TREE_PASS_MS), (64, TREE_PASS_MS * 1.1)))
    running = RunningService(EmulatedTarget(TorchTarget(tiny.target, device="cpu"), profile))
    yield running
    running.close()


@pytest.fixture(scope="module")
def static_torch(tiny):
    """The tiny target on the static-cache torch path (CPU: eager, as CUDA runs a tree's passes)."""
    from remote_verify.backends.torch_static import TorchStaticTarget

    running = RunningService(TorchStaticTarget(tiny.target, device="cpu", slots=4, context=512))
    yield running
    running.close()


def _service(kind: str, service_on, request) -> RunningService:
    if kind in ("emulated", "static"):
        return request.getfixturevalue(f"{kind}_torch")
    return service_on(kind)


@pytest.mark.parametrize("kind, verifies_trees", [("torch", True), ("static", True), ("emulated", True),
                                                  ("llamacpp", False), ("onnx", False)])
def test_greedy_streams_with_trees_are_the_target_alone(service_on, request, kind, verifies_trees):
    """Greedy, with oracle trees: the target's own tokens on every backend, and the Welcome says which
    verify trees. On the emulated device (a pass takes TREE_PASS_MS, so the trees are in time) right
    later children are kept; where only the first-choice path is verified (all wrong), none is."""
    service = _service(kind, service_on, request)
    expected = on_device(service, lambda: target_alone(service.backend, PROMPT, TOKENS))
    made, accepted, said = stream_with_trees(service, PROMPT, expected, SamplingParams(), None)
    assert made == expected
    assert said is verifies_trees
    if kind == "emulated":
        assert accepted >= KEPT_AT_LEAST, accepted  # the right branches were kept: the trees were walked
    elif not verifies_trees:
        assert accepted == 0


def test_sampled_text_is_a_function_of_the_seed_with_and_without_trees(emulated_torch):
    """Seeded sampling: the stream alone, and the stream with trees (most tokens kept guesses), both
    make the target's own race picks for that seed, token for token."""
    backend = emulated_torch.backend
    expected = on_device(emulated_torch, lambda: target_alone(backend, PROMPT, TOKENS, SAMPLED, SEED))
    alone, _, _ = stream_with_trees(emulated_torch, PROMPT, expected, SAMPLED, SEED, trees=False)
    with_trees, accepted, _ = stream_with_trees(emulated_torch, PROMPT, expected, SAMPLED, SEED)
    assert alone == expected and with_trees == expected
    assert accepted >= KEPT_AT_LEAST, accepted
    other_seed = on_device(emulated_torch, lambda: target_alone(backend, PROMPT, TOKENS, SAMPLED, SEED + 1))
    assert other_seed != expected  # the seed decides


# ---- planted bugs: each must change the text --------------------------------------------------------


def _walk_checking_a_child_against_its_siblings_row(tree, pick, stops=frozenset()):
    """Planted: child c compared with the pick of pass row c, which is node c - 1's: the sibling
    before it (or its parent, for a first child), as a chain-minded `row = index` would have it."""
    path, node = [], ROOT
    while True:
        child = next((c for c in tree.children(node) if tree.tokens[c] == pick(c, len(path))), None)
        if child is None:
            return path, pick(node + 1, len(path))
        path.append(child)
        node = child


def _pick_with_clocks_keyed_by_depth(self, result, position, row, depth, before=()):
    """Planted: the race over the clocks of the node's depth in the tree, not of its absolute position."""
    probs = warp(result[row], self.sampling)
    return race_choice(probs, self.randomness.race(depth, probs.shape[0]))


@pytest.mark.parametrize("bug", ["child_against_siblings_row", "clocks_keyed_by_depth", "refused_branch_kv_kept"])
def test_a_planted_tree_bug_changes_the_text(emulated_torch, torch_target, monkeypatch, bug):
    """Each planted bug of a tree's verification makes the stream with trees differ from the target
    alone (the checks above would be red)."""
    service = emulated_torch
    params, seed = (SAMPLED, SEED) if bug == "clocks_keyed_by_depth" else (SamplingParams(), None)
    expected = on_device(service, lambda: target_alone(service.backend, PROMPT, TOKENS, params, seed))
    if bug == "child_against_siblings_row":
        monkeypatch.setattr(session_module, "walk", _walk_checking_a_child_against_its_siblings_row)
    elif bug == "clocks_keyed_by_depth":
        monkeypatch.setattr(Session, "_target_pick", _pick_with_clocks_keyed_by_depth)
    else:
        monkeypatch.setattr(type(torch_target), "keep_path", lambda self, cache, length, nodes: None)
    made, _, _ = stream_with_trees(service, PROMPT, expected, params, seed)
    assert made != expected


@pytest.mark.parametrize("parents, words", [([ROOT, 2, ROOT], "parent 2"), ([ROOT], "one parent per token"),
                                            ([ROOT] * 17, "children")])
def test_a_malformed_tree_is_refused_with_what_is_wrong_and_the_stream_goes_on(service_on, parents, words):
    """A tree whose parent comes after its node, whose parents and tokens differ in number, or with a
    node of too many children: a bad_tree error naming the problem, and the stream still ends whole."""
    service = service_on("llamacpp")
    tokens = [5] * (len(parents) if len(parents) > 1 else 3)
    with connect(service.url, subprotocols=[SUBPROTOCOL]) as ws:
        ws.send(encode(hello(service.backend, SamplingParams(), None)))
        assert isinstance(decode_server_message(ws.recv(timeout=30)), Welcome)
        # a stream far longer than the test, cancelled once the refusal came: the Draft is read while it
        # runs however loaded the machine (one that crosses the stream's last frame is dropped unanswered)
        ws.send(encode(Generate(seq=1, committed_len=0, append=PROMPT, max_tokens=4000)))
        first = decode_server_message(ws.recv(timeout=30))
        made, errors, done = list(first.tokens), [], first.done
        ws.send(encode(Draft(seq=1, chain=1, start=len(PROMPT), tokens=tokens, parents=parents)))
        while not done:  # the refusal and the stream's frames, in whichever order; then the cancel's last
            message = decode_server_message(ws.recv(timeout=30))
            if isinstance(message, Error):
                errors.append(message)
                ws.send(encode(Cancel(seq=1)))
            else:
                made += message.tokens
                done = message.done
    assert [error.code for error in errors] == ["bad_tree"] and words in errors[0].message
    assert not errors[0].fatal
    assert len(made) > 1 and made == on_device(service, lambda: target_alone(service.backend, PROMPT, len(made)))
