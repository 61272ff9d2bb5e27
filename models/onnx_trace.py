"""The torch side of the ONNX export: the module that is traced, and the torch.onnx.export call.

Imported only by `models.onnx_export`, when an export runs (it imports torch and transformers).
"""

from __future__ import annotations

import logging
import warnings

import torch
from transformers import DynamicCache

from models.onnx_manifest import OnnxManifest

OPSET = 18  # run by every onnxruntime since 1.14, so also by older onnxruntime-gpu builds


class CacheAsTensors(torch.nn.Module):
    """A causal LM with its KV cache as flat tensors in and out, and logits at chosen positions only."""

    def __init__(self, model):
        super().__init__()
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()

    def forward(self, input_ids, attention_mask, logit_positions, *past):
        used = attention_mask.shape[1] - input_ids.shape[1]  # cached positions to attend to
        torch._check(used >= 0)
        torch._check(used <= past[0].shape[2])
        cache = DynamicCache([(past[i].narrow(2, 0, used), past[i + 1].narrow(2, 0, used))
                              for i in range(0, len(past), 2)])
        hidden = self.decoder(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                              use_cache=True).last_hidden_state  # (1, S, hidden)
        # The output layer runs on the N rows asked for, not on every position of a long prompt.
        logits = self.head(hidden.index_select(1, logit_positions))  # (1, N, V)
        presents = [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]
        return (logits, *presents)


class TransposedLinear(torch.nn.Module):
    """x @ W^T + b, with W^T a view of W (no copy).

    torch's Linear exports as MatMul(x, Transpose(W)), and the exporter's optimizer folds each
    Transpose into a transposed copy of the weight while the original is still held: twice
    the weights in memory. A parameter that is W^T already exports as a plain MatMul on it;
    being a view, it costs nothing until the file is written, one tensor at a time.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight_t = torch.nn.Parameter(linear.weight.detach().t(), requires_grad=False)  # (in, out)
        self.bias = linear.bias

    def forward(self, x):
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def store_linear_weights_transposed(model: torch.nn.Module) -> None:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, TransposedLinear(child))


def trace(model, manifest: OnnxManifest):
    """torch.onnx.export (dynamo) of the model wrapped in CacheAsTensors, every sequence axis dynamic."""
    store_linear_weights_transposed(model)
    wrapper = CacheAsTensors(model).eval()
    # Sample sizes all different and above 1, so that no axis is specialised to a constant;
    # the cache holds more positions (7) than the mask uses (5): the roll back case.
    seq, cached, used, n_logits = 3, 7, 5, 2
    shape = (1, manifest.num_kv_heads, cached, manifest.head_dim)
    args = (torch.arange(seq).unsqueeze(0), torch.ones(1, used + seq, dtype=torch.long),
            torch.arange(seq - n_logits, seq), *[torch.zeros(shape) for _ in manifest.past_names])
    dim = torch.export.Dim
    past = dim("past")
    dynamic_shapes = ({1: dim("seq")}, {1: dim("total")}, {0: dim("n_logits")},
                      tuple({2: past} for _ in manifest.past_names))
    # torch's exporter warns about optional packages (torchvision) and its own deprecations
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.onnx.export(
                wrapper, args, dynamo=True, dynamic_shapes=dynamic_shapes, opset_version=OPSET,
                input_names=["input_ids", "attention_mask", "logit_positions", *manifest.past_names],
                output_names=["logits", *manifest.present_names], external_data=True, verbose=False)
    finally:
        exporter_log.setLevel(level)


def release_weights(program) -> None:
    """Drop the exported graph's references to torch's tensors.

    onnxscript's rewrite rules keep the last graph they matched, and with it every weight;
    emptying the initializers lets the weights go once the model is deleted.
    """
    for value in program.model.graph.initializers.values():
        value.const_value = None
