"""A vocabulary file from a service, checked in Python before llama.cpp parses a byte of it.

A client with no model file (`--draft ngram`) tokenizes with the GGUF its service sends
(remote_vocab.py). The service is not trusted, and llama.cpp's vocabulary loader has had
memory-safety bugs on crafted files (CVE-2025-49847, a token longer than a buffer; a heap
overflow from a tensor-free GGUF of a few KB was fixed in 2026). So the file is read here
first, with every length bounded before anything is read or allocated by it:

- a little-endian GGUF of version 2 or 3, no tensors, nothing after its metadata but padding;
- only the keys a tokenizer needs, each of the type llama.cpp reads it as: `general.*`
  (the architecture, names), the architecture's hyper-parameters (numbers, read before the
  vocabulary), the `tokenizer.ggml.*` keys llama.cpp knows, the chat templates, `quantize.*`;
- a token list of at most MAX_TOKENS texts of at most MAX_TOKEN_BYTES each, valid UTF-8; a
  token type, a score per token (when present), types in llama.cpp's range; merges of two parts;
  special token ids within the vocabulary; strings and arrays within their bounds.

`checked_vocab_file` returns the vocabulary fingerprint of the token list it validated (the
hash the service checks every Hello against), or raises VocabFileRefused saying what is wrong.

gguf-py's GGUFReader is not used: it maps the file and trusts the counts it reads (and takes
12 s over a Qwen2.5 vocabulary); this reader is struct over a bounded buffer, about 0.3 s.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

from gguf import GGUFValueType as T

from wire.protocol import vocab_fingerprint

MAX_FILE_BYTES = 256 * 1024 * 1024  # a 256k-token vocabulary with its merges is ~20 MB
MAX_KEYS = 512  # a model file has a few dozen
MAX_KEY_BYTES = 256
MAX_TOKENS = 1 << 20  # the largest vocabularies have ~262k tokens
MAX_TOKEN_BYTES = 4096  # Qwen2.5's longest token is 256 bytes; whitespace runs reach a few hundred
MAX_MERGES = 2 * MAX_TOKENS
MAX_STRING_BYTES = 64 * 1024  # a name, a license, a URL
MAX_TEMPLATE_BYTES = 1024 * 1024  # a chat template (Qwen2.5's is 2.5 KB; tool-calling ones reach ~20 KB)
MAX_ARRAY = 4096  # numbers per hyper-parameter array (per-layer values), strings per `general` list
MAX_CHARSMAP_BYTES = 16 * 1024 * 1024  # a SentencePiece normalizer's precompiled map
TOKEN_TYPES = range(0, 7)  # llama.cpp: undefined, normal, unknown, control, user-defined, unused, byte

_NUMBERS = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
            T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}
_INTEGERS = {T.UINT8, T.INT8, T.UINT16, T.INT16, T.UINT32, T.INT32, T.UINT64, T.INT64}
_NAME = re.compile(r"[a-z0-9_.\-]{1,64}")
_TOKEN_ID = re.compile(r"tokenizer\.ggml\.[a-z_]+_token_id")
_TOKENIZER_FLAGS = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token",
                    "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.remove_extra_whitespaces"}
_TOKENIZER_NAMES = {"tokenizer.ggml.model", "tokenizer.ggml.pre"}


class VocabFileRefused(ValueError):
    """The file is not a vocabulary this client gives to llama.cpp; the message says what is wrong."""


class _Reader:
    """Little-endian values from a buffer; every read checked against what is left."""

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def take(self, size: int, what: str) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise VocabFileRefused(f"it ends inside {what} (at byte {self.at}, {size} more wanted)")
        self.at += size
        return self.data[self.at - size:self.at]

    def unpack(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def string(self, limit: int, what: str) -> bytes:
        (length,) = self.unpack("Q", what)
        if length > limit:
            raise VocabFileRefused(f"{what} is {length} bytes long, more than the {limit} allowed")
        return self.take(length, what)

    def value_type(self, what: str) -> T:
        (code,) = self.unpack("I", what)
        try:
            return T(code)
        except ValueError:
            raise VocabFileRefused(f"{what} has the unknown value type {code}") from None


def checked_vocab_file(path: Path) -> str:
    """Validate the vocabulary GGUF at `path`; its vocabulary fingerprint (VocabFileRefused if refused)."""
    size = Path(path).stat().st_size
    if size > MAX_FILE_BYTES:
        raise VocabFileRefused(f"it is {size} bytes, more than a vocabulary's {MAX_FILE_BYTES}")
    return _checked(Path(path).read_bytes())


def _checked(data: bytes) -> str:
    reader = _Reader(data)
    if reader.take(4, "the magic number") != b"GGUF":
        raise VocabFileRefused("it is not a GGUF file")
    (version,) = reader.unpack("I", "the version")
    if version not in (2, 3):
        raise VocabFileRefused(f"it is GGUF version {version} (or big-endian): only little-endian 2 and 3 are read")
    n_tensors, n_kv = reader.unpack("QQ", "the header")
    if n_tensors:
        raise VocabFileRefused(f"it holds {n_tensors} tensors: a vocabulary file holds none")
    if n_kv > MAX_KEYS:
        raise VocabFileRefused(f"it has {n_kv} metadata keys, more than the {MAX_KEYS} allowed")
    items: dict[str, tuple[T, object, T | None]] = {}
    for _ in range(n_kv):
        raw_key = reader.string(MAX_KEY_BYTES, "a key")
        key = _utf8(raw_key, "a key")
        if key in items:
            raise VocabFileRefused(f"the key {key!r} appears twice")
        items[key] = _value(reader, key)
    alignment = items.get("general.alignment", (T.UINT32, 32, None))[1]
    if not isinstance(alignment, int) or not 1 <= alignment <= 1024 or len(data) - reader.at >= alignment \
            or any(data[reader.at:]):
        raise VocabFileRefused(f"{len(data) - reader.at} bytes follow its metadata: a vocabulary file ends there")
    return _checked_vocabulary(items)


def _value(reader: _Reader, key: str) -> tuple[T, object, T | None]:
    """Read the value of `key` by the rule for its key; refuse a type or size the rule does not allow."""
    value_type = reader.value_type(f"the value of {key}")
    if value_type != T.ARRAY:
        if value_type == T.STRING:
            limit = MAX_TEMPLATE_BYTES if key.startswith("tokenizer.chat_template") else MAX_STRING_BYTES
            value = _utf8(reader.string(limit, key), key)
        else:
            value = reader.unpack(_NUMBERS[value_type], key)[0]
        _check_scalar(key, value_type, value)
        return value_type, value, None
    item_type = reader.value_type(f"the items of {key}")
    (count,) = reader.unpack("Q", f"the length of {key}")
    limit, allowed = _array_rule(key)
    if item_type not in allowed:
        raise VocabFileRefused(f"{key} is an array of {item_type.name}, not of {'/'.join(t.name for t in allowed)}")
    if count > limit:
        raise VocabFileRefused(f"{key} has {count} items, more than the {limit} allowed")
    if item_type == T.STRING:
        item_limit = MAX_TOKEN_BYTES if key == "tokenizer.ggml.tokens" else \
            2 * MAX_TOKEN_BYTES + 1 if key == "tokenizer.ggml.merges" else 256
        values = [reader.string(item_limit, f"item {i} of {key}") for i in range(count)]
    else:
        fmt = _NUMBERS[item_type]
        values = list(reader.unpack(f"{count}{fmt}", key)) if count else []
    return T.ARRAY, values, item_type


def _array_rule(key: str) -> tuple[int, set[T]]:
    """(most items, item types) an array under `key` may have."""
    if key == "tokenizer.ggml.tokens":
        return MAX_TOKENS, {T.STRING}
    if key == "tokenizer.ggml.merges":
        return MAX_MERGES, {T.STRING}
    if key == "tokenizer.ggml.token_type":
        return MAX_TOKENS, {T.INT32, T.UINT32}
    if key == "tokenizer.ggml.scores":
        return MAX_TOKENS, {T.FLOAT32}
    if key == "tokenizer.ggml.precompiled_charsmap":
        return MAX_CHARSMAP_BYTES, {T.UINT8, T.INT8}
    if key.startswith("general."):
        return MAX_ARRAY, {T.STRING}
    if _namespace(key) == "architecture":
        return MAX_ARRAY, set(_NUMBERS)
    raise VocabFileRefused(f"the key {key!r} is not one a tokenizer needs (an array)")


def _namespace(key: str) -> str:
    head = key.split(".", 1)[0]
    if head in ("general", "tokenizer", "quantize"):
        return head
    return "architecture" if "." in key and _NAME.fullmatch(head) else "unknown"


def _check_scalar(key: str, value_type: T, value) -> None:
    """Refuse a scalar whose key a tokenizer does not need, or whose type llama.cpp does not read it as."""
    space = _namespace(key)
    if key in _TOKENIZER_NAMES:
        ok = value_type == T.STRING and bool(_NAME.fullmatch(value))
    elif _TOKEN_ID.fullmatch(key) or key == "tokenizer.ggml.token_type_count":
        ok = value_type in _INTEGERS
    elif key in _TOKENIZER_FLAGS:
        ok = value_type == T.BOOL
    elif key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
        ok = value_type == T.STRING
    elif space in ("general", "quantize"):
        ok = True  # names, counts, a license: llama.cpp reads them as text or numbers, bounded above
    elif space == "architecture":
        ok = value_type != T.STRING or len(value) <= 64  # numbers; a few short names (a rope scaling type)
    else:
        ok = False
    if value_type in (T.FLOAT32, T.FLOAT64) and not math.isfinite(value):
        ok = False
    if not ok:
        raise VocabFileRefused(f"the key {key!r} ({value_type.name}) is not one a tokenizer needs, or not of its type")


def _checked_vocabulary(items: dict[str, tuple[T, object, T | None]]) -> str:
    """The token list and what refers to it, consistent; its fingerprint."""
    architecture = items.get("general.architecture")
    if architecture is None or architecture[0] != T.STRING or not _NAME.fullmatch(architecture[1]):
        raise VocabFileRefused("general.architecture is missing or not a name")
    foreign = next((key for key in items if _namespace(key) == "architecture"
                    and not key.startswith(architecture[1] + ".")), None)
    if foreign is not None:
        raise VocabFileRefused(f"the key {foreign!r} is not one a tokenizer needs")
    tokens = items.get("tokenizer.ggml.tokens", (None, None, None))[1]
    if not tokens:
        raise VocabFileRefused("it has no token list (tokenizer.ggml.tokens)")
    for i, text in enumerate(tokens):
        _utf8(text, f"token {i}")
    n = len(tokens)
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        values = items.get(key, (None, None, None))[1]
        if values is not None and len(values) != n:
            raise VocabFileRefused(f"{key} has {len(values)} items for {n} tokens")
    types = items.get("tokenizer.ggml.token_type", (None, [], None))[1]
    if any(t not in TOKEN_TYPES for t in types):
        raise VocabFileRefused(f"tokenizer.ggml.token_type holds {next(t for t in types if t not in TOKEN_TYPES)}, "
                               f"not a token type")
    if any(not math.isfinite(score) for score in items.get("tokenizer.ggml.scores", (None, [], None))[1]):
        raise VocabFileRefused("tokenizer.ggml.scores holds a value that is not finite")
    for i, merge in enumerate(items.get("tokenizer.ggml.merges", (None, [], None))[1]):
        if merge.find(b" ", 1) < 1:
            raise VocabFileRefused(f"merge {i} is not two parts with a space between")
    for key, (_, value, _) in items.items():
        if _TOKEN_ID.fullmatch(key) and not 0 <= value < n:
            raise VocabFileRefused(f"{key} is {value}, outside the {n} tokens")
    return vocab_fingerprint(tokens)


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VocabFileRefused(f"{what} is not UTF-8 text") from None
