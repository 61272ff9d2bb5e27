"""The ONNX Runtime backend on the tiny target: agreement with torch and llama.cpp, roll back, refusals.

The parity, session and sampling tests run on this backend too (it is in BACKENDS); these
check what is particular to it.
"""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from remote_verify.backends.factory import load_backend
from remote_verify.backends.onnx_backend import OnnxTarget

# Largest |logit difference| allowed between onnxruntime and torch, both float32 on the CPU.
# Measured on the tiny target: ~1e-5 (logits have a spread of ~6); 1e-4 leaves room for
# other CPUs' kernels, and is still far below any greedy margin of the tiny models.
LOGIT_TOLERANCE = 1e-4
PROMPTS = ["def quicksort(arr):", "The quick brown fox", "import numpy as np\n", "éàü 中文 🎉",
           "SELECT * FROM users WHERE", "    ", "1, 2, 3, 5, 8,", "A"]


def test_logits_agree_with_torch_through_prefix_blocks_and_roll_backs(onnx_target, torch_target, close_draft):
    """A prompt, then blocks of 5 with 2 rolled back each time: logits within LOGIT_TOLERANCE of torch's."""
    worst = 0.0
    for prompt in PROMPTS:
        tokens = close_draft.tokenize(prompt)
        caches = {b: b.new_cache() for b in (onnx_target, torch_target)}
        logits = {b: b.forward(caches[b], tokens, n_logits=len(tokens)) for b in caches}
        worst = max(worst, np.abs(logits[onnx_target] - logits[torch_target]).max())
        for round_ in range(6):
            block = [int(t) for t in (logits[torch_target][-1].argsort()[-5:] + round_) % onnx_target.vocab_size]
            logits = {b: b.forward(caches[b], block, n_logits=5) for b in caches}
            worst = max(worst, np.abs(logits[onnx_target] - logits[torch_target]).max())
            for backend, cache in caches.items():
                backend.truncate(cache, len(tokens) + 3 * (round_ + 1))
    assert worst < LOGIT_TOLERANCE, worst


def _greedy(backend, context: list[int], n: int) -> list[int]:
    """The backend's own greedy continuation, one token per forward pass."""
    cache, out = backend.new_cache(), []
    logits = backend.forward(cache, context, 1)
    for _ in range(n):
        out.append(int(logits[0].argmax()))
        logits = backend.forward(cache, out[-1:], 1)
    return out


def test_greedy_output_is_token_identical_across_torch_onnx_and_llamacpp(onnx_target, torch_target,
                                                                          llamacpp_target, close_draft):
    """Every prompt, 48 greedy tokens: the three backends produce the same ids."""
    for prompt in PROMPTS:
        context = close_draft.tokenize(prompt)
        outputs = {b.name: _greedy(b, context, 48) for b in (onnx_target, torch_target, llamacpp_target)}
        assert len({tuple(ids) for ids in outputs.values()}) == 1, (prompt, outputs)


def test_a_roll_back_moves_a_length_and_copies_nothing(onnx_target):
    """truncate() keeps the arrays; the next pass reads only the kept positions and returns that many plus new."""
    cache = onnx_target.new_cache()
    onnx_target.forward(cache, [318, 100, 101, 102, 103, 104], n_logits=1)
    arrays = list(cache.past)
    onnx_target.truncate(cache, 4)
    assert cache.length == 4 and cache.past == arrays
    onnx_target.truncate(cache, 10)  # never lengthens
    assert cache.length == 4
    after = onnx_target.forward(cache, [7, 8], n_logits=2)
    assert cache.length == 6 and all(value.shape()[2] == 6 for value in cache.past)
    fresh = onnx_target.forward(onnx_target.new_cache(), [318, 100, 101, 102, 7, 8], n_logits=2)
    np.testing.assert_allclose(after, fresh, atol=1e-5)


def test_the_provider_in_use_is_named_and_logged(onnx_export_dir, caplog):
    """The CPU provider when asked for; CUDA only where onnxruntime-gpu has it, else a clear error."""
    with caplog.at_level(logging.INFO, logger="remote_verify.backends.onnx_backend"):
        target = OnnxTarget(onnx_export_dir, device="cpu")
    assert target.name == "onnx:cpu"
    assert any("CPUExecutionProvider" in record.getMessage() for record in caplog.records)
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert OnnxTarget(onnx_export_dir, device="cuda").name == "onnx:cuda"
    else:
        with pytest.raises(RuntimeError, match="install onnxruntime-gpu"):
            OnnxTarget(onnx_export_dir, device="cuda")


def test_a_damaged_or_foreign_folder_is_refused(onnx_export_dir, tiny, tmp_path):
    """Missing weights, no manifest, an unknown format, changed tokenizer files: refused with what to do."""
    damaged = tmp_path / "damaged"
    shutil.copytree(onnx_export_dir, damaged)
    (damaged / "model.onnx.data").rename(tmp_path / "elsewhere")
    with pytest.raises(RuntimeError, match="onnxruntime cannot load .*export the target again"):
        OnnxTarget(damaged)
    tokenizer = json.loads((damaged / "tokenizer.json").read_text())
    first = next(iter(tokenizer["model"]["vocab"]))
    tokenizer["model"]["vocab"]["renamed"] = tokenizer["model"]["vocab"].pop(first)
    (damaged / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match="not the vocabulary the model was exported with"):
        OnnxTarget(damaged)
    manifest = json.loads((damaged / "specwire-onnx.json").read_text())
    (damaged / "specwire-onnx.json").write_text(json.dumps({**manifest, "format": "specwire-onnx/99"}))
    with pytest.raises(FileNotFoundError, match="export the target again"):
        OnnxTarget(damaged)
    (damaged / "specwire-onnx.json").unlink()
    with pytest.raises(FileNotFoundError, match="specwire models export-onnx"):
        OnnxTarget(damaged)


def test_onnx_is_chosen_by_name_only(onnx_export_dir, tiny):
    """auto never serves an export; --backend onnx on anything else names the export command."""
    with pytest.raises(ValueError, match="is an ONNX export: serve it with --backend onnx"):
        load_backend("auto", onnx_export_dir)
    with pytest.raises(ValueError, match="is not an ONNX export: make one with `specwire models export-onnx"):
        load_backend("onnx", tiny.target)
    assert load_backend("onnx", onnx_export_dir, device="cpu").name == "onnx:cpu"
