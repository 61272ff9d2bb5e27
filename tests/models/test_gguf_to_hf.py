"""A GGUF target for the torch backend: de-quantized once, cached, and equal to its source."""

from __future__ import annotations

import logging

import numpy as np

from models.vocab import gguf_token_texts
from remote_verify.backends.torch_backend import TorchTarget
from wire.protocol import vocab_fingerprint


def test_a_gguf_target_converts_once_and_matches_the_original(tiny, tmp_path, monkeypatch, caplog):
    """The converted target gives the Hugging Face target's logits; the second load converts nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="models.gguf_to_hf"):
        converted = TorchTarget(tiny.target_gguf, device="cpu")
        assert any("de-quantizing" in r.message for r in caplog.records)
    assert converted.path.is_relative_to(tmp_path)
    original = TorchTarget(tiny.target, device="cpu")
    ids = [318, 100, 101, 102, 103]
    np.testing.assert_allclose(converted.forward(converted.new_cache(), ids, 3),
                               original.forward(original.new_cache(), ids, 3), atol=1e-5)
    assert vocab_fingerprint(converted.token_texts()) == vocab_fingerprint(gguf_token_texts(tiny.target_gguf))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="models.gguf_to_hf"):
        again = TorchTarget(tiny.target_gguf, device="cpu")
    assert again.path == converted.path and not caplog.records
