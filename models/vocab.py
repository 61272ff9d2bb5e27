"""Token texts of a model file, in id order, and the check that a pair shares them.

A GGUF file lists its tokens in `tokenizer.ggml.tokens`. A Hugging Face folder has them in
tokenizer.json (vocabulary plus added tokens); ids the tokenizer does not name but the
output layer has are "[PAD<id>]", as llama.cpp's converter names them, so a converted
model and its source agree.
"""

from __future__ import annotations

import json
from pathlib import Path

from wire.protocol import vocab_fingerprint


def gguf_token_texts(path: Path) -> list[bytes]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is None:
        raise ValueError(f"{path} has no token list (tokenizer.ggml.tokens)")
    return [bytes(field.parts[i]) for i in field.data]


def hf_token_texts(model_dir: Path, vocab_size: int | None = None) -> list[bytes]:
    model_dir = Path(model_dir)
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {int(i): text for text, i in tokenizer["model"]["vocab"].items()}
    for added in tokenizer.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
    if vocab_size is None:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        vocab_size = int(config.get("vocab_size", max(by_id) + 1))
    return [by_id.get(i, f"[PAD{i}]").encode("utf-8") for i in range(max(vocab_size, max(by_id) + 1))]


def token_texts(path: Path) -> list[bytes]:
    """Token texts of a GGUF file or a Hugging Face folder."""
    path = Path(path)
    return hf_token_texts(path) if path.is_dir() else gguf_token_texts(path)


def file_fingerprint(path: Path) -> str:
    return vocab_fingerprint(token_texts(path))
