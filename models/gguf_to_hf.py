"""Convert a GGUF target to a Hugging Face folder once, and reuse it afterwards.

transformers reads a GGUF (`gguf_file=`) by de-quantizing every tensor, which takes about
a minute for a 1.5B model. The result is saved as safetensors in the cache, keyed by the
source file's name, size and modification time and by the dtype, so the next start of the
service loads it in seconds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from models.registry import models_dir

log = logging.getLogger(__name__)

MARKER = "specwire-source.json"  # written last: a folder without it is incomplete


def converted_dir(gguf_path: Path, dtype_name: str) -> Path:
    stat = gguf_path.stat()
    key = f"{gguf_path.stem}-{stat.st_size}-{int(stat.st_mtime)}-{dtype_name}"
    return models_dir() / "converted" / key


def ensure_converted(gguf_path: Path, dtype_name: str = "float32") -> Path:
    """A Hugging Face folder holding the de-quantized GGUF; converted on first use only."""
    gguf_path = Path(gguf_path).resolve()
    out = converted_dir(gguf_path, dtype_name)
    if (out / MARKER).is_file():
        return out
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("de-quantizing %s for PyTorch (once; about a minute per billion parameters)", gguf_path.name)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    folder, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype_name))
    # transformers will not save_pretrained() a model it read from GGUF; the weights are
    # plain tensors by now, so write them (shared embeddings once) and a clean config.
    partial.mkdir(parents=True)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(partial)
    save_model(model, str(partial / "model.safetensors"), metadata={"format": "pt"})
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(partial)
    (partial / MARKER).write_text(json.dumps({"source": str(gguf_path), "dtype": dtype_name}))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)
    log.info("saved the converted target in %s", out)
    return out
