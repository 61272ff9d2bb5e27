"""The ONNX Runtime target backend: a `specwire models export-onnx` folder verified by onnxruntime.

The CUDA execution provider runs it when onnxruntime-gpu sees a GPU, the CPU provider
otherwise; the provider in use is logged. Every forward pass goes through I/O binding, so
on a GPU the KV cache stays in device memory between rounds: the cache of a session is the
`present.*` outputs of its last pass, fed back as the next pass's `past_key_values.*`.

A roll back moves a length and copies nothing: the exported graph attends to as many
cached positions as its `attention_mask` is long minus the new tokens, and ignores the
rest (see `models.onnx_manifest`), so the rejected positions are simply never read again
and are dropped from the next pass's output.

No tree attention (the session sends a tree's first-choice path): the exported graph takes a 2D
attention mask and builds its causal mask itself, so a pass cannot say which guesses see which.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnxruntime as ort

from models.onnx_manifest import ManifestError, OnnxManifest
from models.vocab import hf_token_texts
from wire.protocol import vocab_fingerprint

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@dataclass
class OnnxCache:
    past: list[Any] = field(default_factory=list)  # OrtValues (1, kv_heads, >= length, head_dim); empty: none yet
    length: int = 0  # positions valid at the front of each array


class OnnxTarget:
    def __init__(self, path: str | Path, device: str = "auto", manifest: OnnxManifest | None = None,
                 threads: int | None = None):
        self.path = Path(path)
        try:
            self.manifest = manifest or OnnxManifest.read(self.path)
        except ManifestError as exc:
            raise FileNotFoundError(str(exc)) from exc
        m = self.manifest
        model = self.path / m.model
        if not model.is_file():
            raise FileNotFoundError(f"{model} is missing: export the target again")
        self._texts = hf_token_texts(self.path, m.vocab_size)
        if vocab_fingerprint(self._texts) != m.vocab_fingerprint:
            raise ValueError(f"the tokenizer files in {self.path} are not the vocabulary the model was exported "
                             "with (fingerprints differ): export the target again")
        providers = _providers(device)
        try:
            self.session = ort.InferenceSession(str(model), _session_options(threads), providers=providers)
        except Exception as exc:  # onnxruntime's own errors (Fail, InvalidProtobuf, ...) derive from Exception
            raise RuntimeError(f"onnxruntime cannot load {model}: {exc} (export the target again)") from exc
        self.device = "cuda" if self.session.get_providers()[0] == CUDA else "cpu"
        if device == "cuda" and self.device != "cuda":
            raise RuntimeError("--device cuda was asked for, but onnxruntime could not start its CUDA provider "
                               "(is onnxruntime-gpu installed with a matching CUDA?)")
        self.vocab_size = m.vocab_size
        self.max_context = m.max_context
        self.bos_id = m.bos_id
        self.eos_id = m.eos_id
        self.name = f"onnx:{self.device}"
        self.batch_invariant = False  # onnxruntime picks its GEMM by shape, as torch does
        self._dtype = np.dtype(m.dtype)
        self._empty = np.zeros((1, m.num_kv_heads, 0, m.head_dim), dtype=self._dtype)
        log.info("target %s with onnxruntime %s (%s), vocab %d", self.path, ort.__version__,
                 self.session.get_providers()[0], self.vocab_size)

    def token_texts(self) -> list[bytes]:
        return list(self._texts)

    def new_cache(self) -> OnnxCache:
        return OnnxCache()

    def forward(self, cache: OnnxCache, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        m = self.manifest
        n_new = len(tokens)
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", np.asarray([tokens], dtype=np.int64))  # (1, S)
        binding.bind_cpu_input("attention_mask", np.ones((1, cache.length + n_new), dtype=np.int64))  # (1, P+S)
        binding.bind_cpu_input("logit_positions", np.arange(n_new - n_logits, n_new, dtype=np.int64))  # (N,)
        for i, name in enumerate(m.past_names):
            if cache.past:
                binding.bind_ortvalue_input(name, cache.past[i])  # stays where it is (GPU memory on CUDA)
            else:
                binding.bind_cpu_input(name, self._empty)
        binding.bind_output("logits", "cpu")
        for name in m.present_names:
            binding.bind_output(name, self.device)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        cache.past = outputs[1:]
        cache.length += n_new
        return outputs[0].numpy()[0].astype(np.float32, copy=False)  # (n_logits, V)

    def truncate(self, cache: OnnxCache, length: int) -> None:
        # The arrays keep the dropped positions; the next pass's shorter mask leaves them unread.
        cache.length = min(cache.length, length)


def _providers(device: str) -> list[str]:
    available = ort.get_available_providers()
    if device == "cpu":
        return [CPU]
    if CUDA in available:
        return [CUDA, CPU]
    if device == "cuda":
        raise RuntimeError("--device cuda was asked for, but this onnxruntime has no CUDA provider: "
                           "install onnxruntime-gpu in place of onnxruntime")
    return [CPU]


def _session_options(threads: int | None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads  # default: one per physical core
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle worker threads sleep instead of spinning: the service shares its cores with its
    # event loop and, on one machine, with the drafter; spinning doubled the latency here.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # onnxruntime's own log: errors only, unless debugging
    if log.isEnabledFor(logging.DEBUG):
        options.log_severity_level = 1
    return options
