"""Checking an ONNX export the way the service will run it: onnxruntime against torch's logits.

`specwire models export-onnx` hands this to the exporter (models/onnx_export.py), which
keeps no import of the service: the export is promoted only if these logits agree.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.onnx_manifest import OnnxManifest
from remote_verify.backends.onnx_backend import OnnxTarget


def logit_difference(folder: Path, manifest: OnnxManifest, probe: list[int], reference: np.ndarray) -> float:
    """Largest |logit| difference from `reference` (torch's, (len(probe), V)) when the export runs
    as the backend runs it: a prefix, then a roll back of two and the rest."""
    target = OnnxTarget(folder, device="cpu", manifest=manifest)
    cache = target.new_cache()
    first = target.forward(cache, probe[:8], n_logits=8)
    target.truncate(cache, 6)
    second = target.forward(cache, probe[6:], n_logits=len(probe) - 6)
    return max(float(np.abs(first - reference[:8]).max()), float(np.abs(second - reference[6:]).max()))
