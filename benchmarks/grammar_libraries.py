"""Which grammar library masks a real vocabulary fastest: llguidance against outlines-core.

    python -m benchmarks.grammar_libraries [MODEL.gguf]

On the vocabulary of a GGUF file (the default pair's drafter: 151,936 Qwen tokens) and one
JSON schema with nesting, an enum array, a pattern and numbers, each library builds its
vocabulary once, compiles the schema, and computes the mask at every step of a valid reply
(compact JSON, tokenized by longest match). xgrammar is not measured: it requires torch,
transformers and triton, which the client must never load (design.md).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from models.vocab import gguf_token_texts
from wire.grammar import GrammarVocab, TokenConstraint, token_bytes
from wire.protocol import Grammar

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
                                                 "zip": {"type": "number"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}
REPLY = {"name": "Ada Lovelace", "age": 36, "tags": ["a", "ccc"], "address": {"city": "London", "zip": 12.5}}


def measure_llguidance(texts: list[bytes], end_id: int) -> dict:
    started = time.perf_counter()
    vocab = GrammarVocab(texts)
    built = time.perf_counter() - started
    reply = vocab.greedy(json.dumps(REPLY, separators=(",", ":")).encode())
    started = time.perf_counter()
    constraint = TokenConstraint(Grammar("json_schema", json.dumps(SCHEMA)), vocab, [end_id])
    compiled = time.perf_counter() - started
    steps = []
    for i in range(len(reply) + 1):
        constraint.follow(reply[:i])
        started = time.perf_counter()
        allowed = constraint.allowed(len(texts))
        steps.append(time.perf_counter() - started)
        assert i == len(reply) or allowed[reply[i]]
    return {"vocab_s": built, "compile_s": compiled, "mask_ms_mean": 1e3 * np.mean(steps),
            "mask_ms_max": 1e3 * max(steps), "tokens": len(reply)}


def measure_outlines_core(texts: list[bytes], end_id: int) -> dict:
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    pieces = token_bytes(texts)
    started = time.perf_counter()
    by_bytes: dict[bytes, list[int]] = {}
    for i, piece in enumerate(pieces):
        if piece[:1] != b"\xff" and i != end_id:
            by_bytes.setdefault(piece, []).append(i)
    vocabulary = outlines_core.Vocabulary(end_id, by_bytes)
    built = time.perf_counter() - started
    started = time.perf_counter()
    index = outlines_core.Index(build_regex_from_schema(json.dumps(SCHEMA)), vocabulary)
    compiled = time.perf_counter() - started
    guide = outlines_core.Guide(index)
    reply = GrammarVocab(texts).greedy(json.dumps(REPLY, separators=(",", ":")).encode())
    steps = []
    for token in reply:
        started = time.perf_counter()
        guide.get_tokens()
        steps.append(time.perf_counter() - started)
        guide.advance(token)
    return {"vocab_s": built, "compile_s": compiled, "mask_ms_mean": 1e3 * np.mean(steps),
            "mask_ms_max": 1e3 * max(steps), "tokens": len(reply)}


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / (
        ".cache/specwire/models/qwen2.5-coder/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    texts = gguf_token_texts(path)
    end_id = texts.index(b"<|im_end|>") if b"<|im_end|>" in texts else len(texts) - 1
    print(f"{path.name}: {len(texts):,} tokens")
    for name, measure in (("llguidance", measure_llguidance), ("outlines-core", measure_outlines_core)):
        try:
            result = measure(texts, end_id)
        except ImportError as exc:
            print(f"{name}: not installed ({exc})")
            continue
        print(f"{name}: vocabulary {result['vocab_s']:.2f} s, compile {1e3 * result['compile_s']:.1f} ms, "
              f"mask {result['mask_ms_mean']:.3f} ms mean / {result['mask_ms_max']:.3f} ms max "
              f"over {result['tokens']} tokens")


if __name__ == "__main__":
    main()
