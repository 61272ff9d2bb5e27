"""The ONNX export: what the folder holds, the graph's interface, and the targets it refuses."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import onnxruntime as ort
import pytest

from models import onnx_export
from models.onnx_export import ExportError, export_onnx
from remote_verify.backends.onnx_check import logit_difference
from models.onnx_manifest import MANIFEST_NAME, OnnxManifest
from wire.protocol import vocab_fingerprint


def test_the_export_holds_the_model_its_tokenizer_and_a_manifest(onnx_export_dir, torch_target):
    """model.onnx, its weights, tokenizer files, and a manifest that describes the tiny target."""
    names = {path.name for path in onnx_export_dir.iterdir()}
    assert {"model.onnx", "model.onnx.data", "tokenizer.json", MANIFEST_NAME} <= names
    manifest = OnnxManifest.read(onnx_export_dir)
    assert manifest.vocab_fingerprint == vocab_fingerprint(torch_target.token_texts())
    assert (manifest.vocab_size, manifest.bos_id, manifest.eos_id) == (
        torch_target.vocab_size, torch_target.bos_id, torch_target.eos_id)
    assert (manifest.num_layers, manifest.num_kv_heads, manifest.head_dim) == (2, 2, 16)
    assert (manifest.architecture, manifest.dtype, manifest.opset) == ("Qwen2ForCausalLM", "float32", 18)
    assert manifest.max_context == torch_target.max_context
    assert 0.0 <= manifest.check_max_abs_logit_diff < 1e-4  # the export compared itself with torch


def test_the_graph_takes_and_returns_the_cache_with_dynamic_sequence_axes(onnx_export_dir):
    """Inputs and outputs are named as the manifest says; batch is 1, every sequence axis is free."""
    manifest = OnnxManifest.read(onnx_export_dir)
    session = ort.InferenceSession(str(onnx_export_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert list(inputs) == ["input_ids", "attention_mask", "logit_positions", *manifest.past_names]
    assert list(outputs) == ["logits", *manifest.present_names]
    assert inputs["input_ids"][0] == 1 and isinstance(inputs["input_ids"][1], str)
    assert isinstance(inputs["logit_positions"][0], str)
    assert outputs["logits"][0] == 1 and outputs["logits"][2] == manifest.vocab_size
    for name in manifest.past_names:
        assert inputs[name][:2] == [1, 2] and isinstance(inputs[name][2], str) and inputs[name][3] == 16
    for name in manifest.present_names:
        assert isinstance(outputs[name][2], str)


def _hf_folder(tmp_path, tiny, **config_changes):
    folder = tmp_path / "model"
    shutil.copytree(tiny.target, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_targets_that_cannot_be_exported_get_a_clear_error(tiny, onnx_export_dir, tmp_path):
    """Missing, foreign, unsupported or incomplete targets are refused before any work, saying why."""
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="no target at"):
        export_onnx(tmp_path / "nothing-here", out, check=logit_difference)
    with pytest.raises(ExportError, match="is an ONNX export already"):
        export_onnx(onnx_export_dir, out, check=logit_difference)
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    with pytest.raises(ExportError, match="neither a Hugging Face folder nor a readable GGUF file"):
        export_onnx(not_gguf, out, check=logit_difference)
    with pytest.raises(ExportError, match=r"model type 'gpt2' cannot be exported.*qwen2, llama"):
        export_onnx(_hf_folder(tmp_path / "a", tiny, model_type="gpt2"), out, check=logit_difference)
    with pytest.raises(ExportError, match="sliding-window attention"):
        export_onnx(_hf_folder(tmp_path / "b", tiny, use_sliding_window=True), out, check=logit_difference)
    no_tokenizer = _hf_folder(tmp_path / "c", tiny)
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(ExportError, match="no tokenizer.json"):
        export_onnx(no_tokenizer, out, check=logit_difference)
    assert not out.exists()  # nothing was written


def test_an_occupied_output_folder_or_a_full_disk_is_refused(tiny, tmp_path, monkeypatch):
    """A folder holding other files is never overwritten; a disk without room for the weights is named."""
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not an earlier ONNX export"):
        export_onnx(tiny.target, occupied, check=logit_difference)
    assert (occupied / "keep.txt").read_text() == "mine"
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(onnx_export.shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 1000, 1000))
    with pytest.raises(ExportError, match=r"not enough disk space in .*: the export needs about"):
        export_onnx(tiny.target, tmp_path / "out", check=logit_difference)


def test_a_llama_target_exports_and_agrees_with_torch(tiny, tmp_path):
    """A small random Llama (the other supported family) exports; onnxruntime's logits match torch's."""
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from remote_verify.backends.onnx_backend import OnnxTarget
    from remote_verify.backends.torch_backend import TorchTarget

    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=318, eos_token_id=319)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    shutil.copy(tiny.target / "tokenizer.json", tmp_path / "llama" / "tokenizer.json")
    result = export_onnx(tmp_path / "llama", tmp_path / "llama-onnx", check=logit_difference)
    assert result.manifest.architecture == "LlamaForCausalLM"
    exported, reference = OnnxTarget(result.out, device="cpu"), TorchTarget(tmp_path / "llama", device="cpu")
    tokens = [318, 5, 77, 140, 9, 260, 31]
    # random initialisation gives small logits: compare relative to their scale
    expected = reference.forward(reference.new_cache(), tokens, 7)
    np.testing.assert_allclose(exported.forward(exported.new_cache(), tokens, 7), expected,
                               rtol=0, atol=1e-4 * np.abs(expected).max())
