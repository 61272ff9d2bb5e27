"""Export a target to ONNX with its KV cache as inputs and outputs (`specwire models export-onnx`).

A target is a Hugging Face folder or a GGUF file (de-quantized once through
`models.gguf_to_hf`, as the torch backend does). The model is traced by torch.export
(torch.onnx's dynamo exporter) through a wrapper that takes the cache as flat tensors and
returns it the same way; the interface is described in `models.onnx_manifest`. The folder
written holds model.onnx, its weights in model.onnx.data, the tokenizer files and the
manifest, which is written last, after onnxruntime has run the export and its logits have
been compared with torch's.

torch, transformers and onnxruntime are imported inside the functions that use them.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Callable

from models.onnx_manifest import MODEL_NAME, OnnxManifest, is_onnx_export

log = logging.getLogger(__name__)

# Decoder-only models (config.json's model_type) whose logits are the output layer applied
# to the last hidden state and whose cache is one full-attention DynamicLayer per layer.
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json", "generation_config.json")
CHECK_TOLERANCE = 1e-2  # largest |logit difference| with torch accepted (measured: 1e-5 tiny, 1.2e-4 at 1.5B)
STAGES = 5


class ExportError(Exception):
    """A target that cannot be exported, and what to do about it."""


@dataclass(frozen=True)
class ExportResult:
    out: Path
    manifest: OnnxManifest
    seconds: float
    size_bytes: int


Progress = Callable[[str], None]
# (export folder, manifest, probe tokens, torch's logits for them) -> largest |logit difference|:
# the service's own onnxruntime run (remote_verify/backends/onnx_check.py), given by the caller
Check = Callable[[Path, OnnxManifest, list, object], float]


def export_onnx(target: Path, out: Path, check: Check, progress: Progress = log.info) -> ExportResult:
    """Export `target` (HF folder or GGUF file) to the folder `out`, promoted only when `check` finds
    its logits within CHECK_TOLERANCE of torch's; `progress` gets one line per stage."""
    started = time.monotonic()
    target, out = Path(target).expanduser(), Path(out).expanduser()
    _check_destination(target, out)

    progress(f"[1/{STAGES}] reading the target {target}")
    hf_dir = _hugging_face_folder(target, out, progress)
    _check_config(hf_dir)
    model = _load_model(hf_dir)
    manifest = _describe(model, hf_dir, source=target)
    probe = _probe_tokens(manifest.vocab_size)
    reference = _torch_logits(model, probe)  # (len(probe), V), before the model is rearranged

    progress(f"[2/{STAGES}] tracing {manifest.architecture} with torch.export "
             f"({manifest.num_layers} layers, vocabulary {manifest.vocab_size:,})")
    program = _trace(model, manifest)

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        progress(f"[3/{STAGES}] writing {out / MODEL_NAME} and its weights")
        program.save(str(partial / MODEL_NAME), external_data=True)
        for name in COPIED_FILES:
            if (hf_dir / name).is_file():
                shutil.copy2(hf_dir / name, partial / name)
        _release(program)
        del program, model  # the weights leave memory before onnxruntime loads its own copy
        gc.collect()

        progress(f"[4/{STAGES}] checking the export with onnxruntime against torch's logits")
        difference = _checked(check, partial, manifest, probe, reference)
        manifest = replace(manifest, check_max_abs_logit_diff=difference)
        manifest.write(partial)  # last: a folder without the manifest is not an export
        shutil.rmtree(out, ignore_errors=True)
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    seconds = time.monotonic() - started
    progress(f"[5/{STAGES}] exported to {out}: {size / 1e6:,.1f} MB in {seconds:.1f} s "
             f"(logits within {difference:.1e} of torch)")
    return ExportResult(out, manifest, seconds, size)


def _check_destination(target: Path, out: Path) -> None:
    if not target.exists():
        raise ExportError(f"no target at {target}: give a Hugging Face model folder or a GGUF file")
    if is_onnx_export(target):
        raise ExportError(f"{target} is an ONNX export already: serve it with `specwire serve --backend onnx`")
    if out.resolve() == target.resolve():
        raise ExportError("the output folder must differ from the target")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not is_onnx_export(out))):
        raise ExportError(f"{out} exists and is not an earlier ONNX export: choose a new or empty folder")


def _hugging_face_folder(target: Path, out: Path, progress: Progress) -> Path:
    """The target as a Hugging Face folder, de-quantizing a GGUF file first (cached)."""
    if target.is_dir():
        weights = _folder_float32_bytes(target)
        _check_resources([(out, weights)], weights, progress)
        return target
    from models.gguf_to_hf import MARKER, converted_dir, ensure_converted

    weights = _gguf_float32_bytes(target)
    cache = converted_dir(target.resolve(), "float32")
    writes = [(out, weights)] + ([] if (cache / MARKER).is_file() else [(cache, weights)])
    _check_resources(writes, weights, progress)
    try:
        return ensure_converted(target, "float32")
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise ExportError(f"cannot read the GGUF target {target}: {exc}") from exc


def _check_config(hf_dir: Path) -> None:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ExportError(f"no Hugging Face model at {hf_dir} (config.json missing)")
    config = json.loads(path.read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ExportError(f"model type {model_type!r} cannot be exported to ONNX by specwire: supported types are "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)} (serve it with --backend torch instead)")
    if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
        raise ExportError(f"{hf_dir} uses sliding-window attention, which the ONNX export does not support "
                          "(serve it with --backend torch instead)")
    if not (hf_dir / "tokenizer.json").is_file():
        raise ExportError(f"{hf_dir} has no tokenizer.json: the export needs it for the vocabulary fingerprint")


def _load_model(hf_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        # float32: onnxruntime's CPU kernels are float32, and logits agree with torch on the CPU
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot load the model in {hf_dir}: {exc}") from exc
    return model.eval()


def _describe(model, hf_dir: Path, source: Path) -> OnnxManifest:
    from models.onnx_trace import OPSET
    from models.vocab import hf_token_texts
    from wire.protocol import vocab_fingerprint

    config = model.config
    vocab_size = int(config.vocab_size)
    eos = config.eos_token_id
    return OnnxManifest(
        architecture=type(model).__name__,
        source=str(source.resolve()),
        vocab_fingerprint=vocab_fingerprint(hf_token_texts(hf_dir, vocab_size)),
        vocab_size=vocab_size,
        bos_id=int(config.bos_token_id) if config.bos_token_id is not None else -1,
        eos_id=int(eos[0] if isinstance(eos, list) else eos) if eos is not None else -1,
        num_layers=int(config.num_hidden_layers),
        num_kv_heads=int(config.num_key_value_heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads),
        dtype="float32",
        opset=OPSET,
        max_context=int(getattr(config, "max_position_embeddings", 4096)),
        exported_with={name: _version(name) for name in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime")},
    )


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _probe_tokens(vocab_size: int) -> list[int]:
    return [(7919 * i + 13) % vocab_size for i in range(12)]  # spread over the vocabulary, deterministic


def _torch_logits(model, tokens: list[int]):
    import torch

    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0].numpy()


def _trace(model, manifest: OnnxManifest):
    from models.onnx_trace import trace

    try:
        return trace(model, manifest)
    except Exception as exc:  # torch.export's errors are many and long; the first line says which
        log.debug("torch.onnx.export failed", exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"torch could not export {manifest.architecture}: {first} (run with -vv for details)") from exc


def _release(program) -> None:
    from models.onnx_trace import release_weights

    release_weights(program)


def _checked(check: Check, folder: Path, manifest: OnnxManifest, probe: list[int], reference) -> float:
    """The export's largest logit difference from torch, by `check`; ExportError when too large."""
    difference = check(folder, manifest, probe, reference)
    if not difference <= CHECK_TOLERANCE:  # also catches NaN
        raise ExportError(f"the exported model's logits differ from torch's by {difference:.3g} "
                          f"(more than {CHECK_TOLERANCE}): the export is wrong; please report it")
    return difference


def _folder_float32_bytes(folder: Path) -> int:
    """Bytes the weights of a Hugging Face folder take in float32."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    stored = sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".safetensors", ".bin"))
    widen = 2 if str(config.get("torch_dtype", config.get("dtype", "float32"))) in ("float16", "bfloat16") else 1
    return stored * widen


def _gguf_float32_bytes(path: Path) -> int:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path), "r")
    except Exception as exc:  # gguf raises bare ValueErrors and struct errors on foreign files
        raise ExportError(f"{path} is neither a Hugging Face folder nor a readable GGUF file ({exc})") from exc
    return sum(int(tensor.n_elements) * 4 for tensor in reader.tensors)


def _check_resources(writes: list[tuple[Path, int]], weight_bytes: int, progress: Progress) -> None:
    """Refuse early when the files will not fit on disk; warn when memory looks short.

    Each write is a folder and the float32 weights it will receive, plus a tenth for the
    graph and a separate output layer. Writes on one filesystem add up.
    """
    needed: dict[int, tuple[Path, int]] = {}
    for folder, size in writes:
        existing = Path(folder).resolve()
        while not existing.exists():
            existing = existing.parent
        device = existing.stat().st_dev
        needed[device] = (existing, needed.get(device, (existing, 0))[1] + int(size * 1.1))
    for existing, size in needed.values():
        free = shutil.disk_usage(existing).free
        if free < size:
            raise ExportError(f"not enough disk space in {existing}: the export needs about {size / 1e9:.1f} GB, "
                              f"{free / 1e9:.1f} GB is free")
    available = _available_memory()
    # torch holds the weights while tracing; onnxruntime loads them again once torch let go
    if available is not None and available < weight_bytes * 1.2:
        progress(f"warning: the export needs about {weight_bytes * 1.2 / 1e9:.1f} GB of memory and "
                 f"{available / 1e9:.1f} GB is available; it may be killed")


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None  # not Linux: no warning

