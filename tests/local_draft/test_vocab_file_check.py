"""A service's vocabulary file is validated in Python before llama.cpp parses it: real vocabulary files
pass with llama.cpp's fingerprint; crafted ones (huge tokens, tensors, bad ids, lying lengths,
unknown keys) are refused with a message, from a bounded read."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import pytest

from local_draft.draft_model import DraftModel
from local_draft.vocab_file_check import MAX_TOKEN_BYTES, VocabFileRefused, checked_vocab_file
from models.vocab_gguf import read_metadata, write_vocab_gguf
from tests.local_draft.test_remote_vocab import default_target

T = gguf.GGUFValueType


@pytest.fixture(scope="module")
def tiny_vocab(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vocab") / "tiny-vocab.gguf"
    write_vocab_gguf(tiny.target_gguf, out)
    return out


def rewritten(source: Path, out: Path, change=None, extra=()) -> Path:
    """`source`'s metadata written again by gguf-py, each (key, type, value, item type) passed through
    `change` (None drops it), then `extra` items."""
    items = [item for item in read_metadata(source) if item[0] != gguf.Keys.General.ARCHITECTURE]
    architecture = next(v for k, _, v, _ in read_metadata(source) if k == gguf.Keys.General.ARCHITECTURE)
    writer = gguf.GGUFWriter(str(out), architecture.decode())
    for item in [*items, *extra]:
        item = change(item) if change is not None else item
        if item is not None:
            key, value_type, value, sub_type = item
            writer.add_key_value(key, value, value_type, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def raw_gguf(out: Path, pairs: list[tuple[str, int, bytes]], n_tensors: int = 0, tail: bytes = b"") -> Path:
    """A GGUF written byte by byte: (key, value type, encoded value) pairs, counts as given."""
    def string(text: bytes) -> bytes:
        return struct.pack("<Q", len(text)) + text

    body = b"".join(string(key.encode()) + struct.pack("<I", value_type) + value for key, value_type, value in pairs)
    out.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(pairs)) + body + tail)
    return out


def test_real_vocabulary_files_pass_with_llama_cpps_own_fingerprint(tiny_vocab, tmp_path):
    """The tiny target's and the default pair's vocabulary files (as a service offers them) pass; the
    fingerprint of the validated token list is the one llama.cpp computes from the loaded file."""
    assert checked_vocab_file(tiny_vocab) == DraftModel(tiny_vocab, vocab_only=True).vocab_fingerprint
    default = write_vocab_gguf(default_target(), tmp_path / "default-vocab.gguf") and tmp_path / "default-vocab.gguf"
    assert checked_vocab_file(default) == DraftModel(default, vocab_only=True).vocab_fingerprint


def _with(key, value):
    def change(item):
        return (item[0], item[1], value(item[2]), item[3]) if item[0] == key else item
    return change


@pytest.mark.parametrize("name, change, extra, words", [
    ("a token longer than any", _with("tokenizer.ggml.tokens", lambda v: v[:5] + [b"x" * 100_000] + v[6:]), (),
     f"item 5 of tokenizer.ggml.tokens is 100000 bytes long, more than the {MAX_TOKEN_BYTES}"),
    ("a token that is not UTF-8", _with("tokenizer.ggml.tokens", lambda v: v[:7] + [b"\xff\xfe"] + v[8:]), (),
     "token 7 is not UTF-8"),
    ("a BOS id outside the vocabulary", _with("tokenizer.ggml.bos_token_id", lambda v: 10**6), (),
     "tokenizer.ggml.bos_token_id is 1000000, outside the 320 tokens"),
    ("a token type llama.cpp has not", _with("tokenizer.ggml.token_type", lambda v: v[:-1] + [99]), (),
     "token_type holds 99"),
    ("fewer types than tokens", _with("tokenizer.ggml.token_type", lambda v: v[:-3]), (),
     "token_type has 317 items for 320 tokens"),
    ("a merge of one part", _with("tokenizer.ggml.merges", lambda v: [b"abc"] + v[1:]), (),
     "merge 0 is not two parts"),
    ("a key a tokenizer does not need", None, [("evil.payload", T.STRING, "x", None)],
     "'evil.payload' is not one a tokenizer needs"),
    ("an embedded tokenizer.json", None, [("tokenizer.huggingface.json", T.STRING, "{}", None)],
     "'tokenizer.huggingface.json' (STRING) is not one a tokenizer needs"),
    ("a hyper-parameter as a long string", None, [("qwen2.context_length_text", T.STRING, "9" * 200, None)],
     "'qwen2.context_length_text' (STRING) is not one"),
    ("a huge chat template", None, [("tokenizer.chat_template.big", T.STRING, "x" * (2 << 20), None)],
     "tokenizer.chat_template.big is 2097152 bytes long"),
    ("scores for fewer tokens than there are", None, [("tokenizer.ggml.scores", T.ARRAY, [1.0, 2.0], T.FLOAT32)],
     "tokenizer.ggml.scores has 2 items for 320 tokens"),
])
def test_crafted_files_are_refused_saying_why(tiny_vocab, tmp_path, name, change, extra, words):
    """Each crafted variant of a real vocabulary file is refused with a message naming what is wrong."""
    with pytest.raises(VocabFileRefused, match=words.replace("(", r"\(").replace(")", r"\)")):
        checked_vocab_file(rewritten(tiny_vocab, tmp_path / "crafted.gguf", change, extra))


def test_lengths_are_checked_before_anything_is_read_by_them(tiny_vocab, tmp_path):
    """Counts that lie (an array of 2**40 tokens in a 100-byte file, a 2**60-byte string), tensors,
    a cut file and bytes after the metadata are refused at once, without reading or allocating by them."""
    arch = ("general.architecture", T.STRING, struct.pack("<Q", 5) + b"qwen2")
    lying_array = ("tokenizer.ggml.tokens", T.ARRAY, struct.pack("<IQ", T.STRING, 2**40))
    lying_string = ("general.name", T.STRING, struct.pack("<Q", 2**60) + b"x")
    cases = [
        (raw_gguf(tmp_path / "a.gguf", [arch, lying_array]), "tokenizer.ggml.tokens has 1099511627776 items"),
        (raw_gguf(tmp_path / "b.gguf", [arch, lying_string]), "general.name is 1152921504606846976 bytes long"),
        (raw_gguf(tmp_path / "c.gguf", [arch], n_tensors=1), "it holds 1 tensors"),
        (raw_gguf(tmp_path / "d.gguf", [arch], tail=b"\x01" * 8), "8 bytes follow its metadata"),
        (raw_gguf(tmp_path / "e.gguf", [arch]), "it has no token list"),
    ]
    whole = tiny_vocab.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    cases.append((tmp_path / "cut.gguf", "it ends inside"))
    (tmp_path / "big-endian.gguf").write_bytes(b"GGUF" + struct.pack(">I", 3) + whole[8:])
    cases.append((tmp_path / "big-endian.gguf", "GGUF version 50331648"))
    (tmp_path / "many-keys.gguf").write_bytes(whole[:16] + struct.pack("<Q", 10**6) + whole[24:])
    cases.append((tmp_path / "many-keys.gguf", "1000000 metadata keys"))
    for path, words in cases:
        with pytest.raises(VocabFileRefused, match=words):
            checked_vocab_file(path)
