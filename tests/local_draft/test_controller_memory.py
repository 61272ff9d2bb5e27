"""Adaptive k's memory: its state round-trips through the cache file, keyed by service and pair, and bad files are ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from local_draft.adaptive_k import START_K, AdaptiveK, RoundTiming
from local_draft.controller_memory import ControllerMemory, memory_path, service_key


def trained() -> AdaptiveK:
    """A controller that has seen rounds of a well-accepted drafter, cheap to run, behind a slow link."""
    controller = AdaptiveK()
    for k in (4, 6, 4, 0, 2, 4, 6, 4):
        controller.observe(RoundTiming(k=k, accepted=max(0, k - 1), draft_s=0.001 * k, draft_tokens=k,
                                       fed_tokens=k + 1, service_s=0.02 + 0.005 * k, wire_s=0.1))
    controller.choose(100)
    return controller


def test_a_saved_state_restores_what_was_learned(tmp_path):
    """Saved and loaded, a controller predicts and chooses as the one that learned; a fresh one starts at its prior."""
    memory = ControllerMemory("ws://gpu-host:8765", "draft.gguf", "target.gguf", path=tmp_path / "k.json")
    learned = trained()
    memory.save(learned)
    restored = AdaptiveK()
    assert memory.load_into(restored)
    assert restored.state() == json.loads(json.dumps(learned.state()))
    assert restored.expected_rate(6, restored.alpha) == pytest.approx(learned.expected_rate(6, learned.alpha))
    assert restored.choose(100) == learned.best_k(learned.alpha, 16) != START_K  # informed from the first round
    assert AdaptiveK().choose(100) == START_K


def test_keys_separate_services_and_pairs(tmp_path):
    """Another service or another pair does not see the state; a local service's port does not matter."""
    path = tmp_path / "k.json"
    ControllerMemory("ws://127.0.0.1:40001", "draft.gguf", "target.gguf", path=path).save(trained())
    assert ControllerMemory("ws://127.0.0.1:40999", "draft.gguf", "target.gguf", path=path).load_into(AdaptiveK())
    assert not ControllerMemory("ws://gpu-host:8765", "draft.gguf", "target.gguf", path=path).load_into(AdaptiveK())
    assert not ControllerMemory("ws://127.0.0.1:40001", "other.gguf", "target.gguf", path=path).load_into(AdaptiveK())
    assert service_key("wss://gpu-host:8765/v") == "wss://gpu-host:8765/v"


@pytest.mark.parametrize("content", ["not json", "[]", '{"KEY": {"accepted": [1]}}',
                                     '{"KEY": {"accepted": [1, 2], "draft_token_s": [1, 1], "wire_s": [1, 1], '
                                     '"verify": [1, 2, 3], "last_choice": 4}}',
                                     '{"KEY": {"accepted": [NaN, 2], "draft_token_s": [1, 1], "wire_s": [1, 1], '
                                     '"verify": [1, 2, 3, 4, 5], "last_choice": 4}}',
                                     # a 400-digit integer: float() raises OverflowError, which crashed every start
                                     '{"KEY": {"accepted": [' + "9" * 400 + ', 2], "draft_token_s": [1, 1], '
                                     '"wire_s": [1, 1], "verify": [1, 2, 3, 4, 5], "last_choice": 4}}',
                                     "[" * 100_000 + "]" * 100_000,  # nested past the recursion limit
                                     "{}" + " " * (2 << 20)],  # larger than any state file
                         ids=["not-json", "a-list", "short-pair", "short-verify", "nan", "400-digits", "deep", "huge"])
def test_a_damaged_file_is_ignored(tmp_path, content):
    """A file that is not a saved state leaves the controller at its priors, without an error."""
    memory = ControllerMemory("ws://h:1", "d", "t", path=tmp_path / "k.json")
    memory.path.write_text(content.replace("KEY", memory.key))
    controller = AdaptiveK()
    before = controller.state()
    assert not memory.load_into(controller)
    assert controller.state() == before
    memory.save(trained())  # and it is replaced by a good one
    assert memory.load_into(AdaptiveK())


def test_the_key_holds_a_hash_of_the_targets_name_not_the_name(tmp_path):
    """The target's name is the service's to choose (up to a frame): the file keys it by a short hash."""
    path = tmp_path / "k.json"
    long_name = "evil\x1b]52;c;aGk=\x07" + "x" * (4 << 20)
    memory = ControllerMemory("ws://h:1", "d.gguf", long_name, path=path)
    memory.save(trained())
    assert path.stat().st_size < 4096 and "evil" not in path.read_text()
    assert memory.load_into(AdaptiveK())
    assert not ControllerMemory("ws://h:1", "d.gguf", "other", path=path).load_into(AdaptiveK())


def test_the_file_follows_the_cache_conventions(monkeypatch, tmp_path):
    """SPECWIRE_ADAPTIVE_STATE names the file; otherwise it is in $XDG_CACHE_HOME/specwire."""
    monkeypatch.setenv("SPECWIRE_ADAPTIVE_STATE", str(tmp_path / "mine.json"))
    assert memory_path() == tmp_path / "mine.json"
    monkeypatch.delenv("SPECWIRE_ADAPTIVE_STATE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert memory_path() == tmp_path / "cache" / "specwire" / "adaptive-k.json"


@pytest.mark.parametrize("mode", ["rounds", "hybrid"])
def test_generate_saves_and_starts_from_the_state(tiny, service_on, tmp_path, mode):
    """`specwire generate` writes what its controller learned (adaptive k in rounds; the stream's
    drafting decision and costs by default); the next run starts from it and saves its own."""
    url = service_on("llamacpp").url
    state_file = tmp_path / "adaptive-k.json"
    env = dict(os.environ, SPECWIRE_ADAPTIVE_STATE=str(state_file), PYTHONPATH=str(Path(__file__).parents[2]))
    command = [sys.executable, "-m", "app.cli", "generate", "--draft", str(tiny.draft), "--server", url,
               "--prompt", "def quicksort(arr):", "--max-tokens", "32", "--json", "--mode", mode]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
    first = json.loads(state_file.read_text())
    assert len(first) == 1
    (key, state), = first.items()
    assert key.startswith("ws://127.0.0.1 | draft.gguf | ") and key.endswith(" | hybrid") == (mode == "hybrid")
    if mode == "rounds":
        assert state["draft_token_s"][1] > 0 and state["wire_s"][1] > 0  # costs were measured
    else:
        assert state["wire_s"][1] > 0 and state["acceptance"][1] > 0  # the round trip was measured
    again = subprocess.run(command[:3] + ["-v"] + command[3:], env=env, check=True, capture_output=True, text=True,
                           timeout=120)
    assert f"adaptive k starts from the state saved for {key}" in again.stderr
    assert json.loads(state_file.read_text())[key] != state  # and saved what it learned after that
