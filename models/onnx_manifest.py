"""The manifest of an ONNX export: what the service must know about model.onnx without torch.

`specwire models export-onnx` writes it last (a folder without it is not a finished export);
the ONNX backend reads it to name the graph's inputs and outputs, shape an empty KV cache
and check that the tokenizer files beside it are the vocabulary the model was exported with.

The graph's interface (batch of one; every sequence axis dynamic):

    input_ids                 int64 (1, S)              the tokens to append
    attention_mask            int64 (1, P + S), all ones  its length says how many cached
                                                        positions P to attend to
    logit_positions           int64 (N,)                which of the S positions get logits
    past_key_values.{i}.key   dtype (1, kv_heads, C, head_dim) with C >= P: the cache; only
    past_key_values.{i}.value                           its first P positions are read
    ->
    logits                    float (1, N, vocab)
    present.{i}.key/value     dtype (1, kv_heads, P + S, head_dim)

Reading only the first P cached positions is what makes a roll back free: the session keeps
the arrays it has and passes a shorter mask, on the CPU or on the GPU alike.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_NAME = "specwire-onnx.json"
MODEL_NAME = "model.onnx"
FORMAT = "specwire-onnx/1"


class ManifestError(Exception):
    """A folder that is not a finished, readable ONNX export."""


@dataclass(frozen=True)
class OnnxManifest:
    architecture: str
    source: str  # the target it was exported from
    vocab_fingerprint: str
    vocab_size: int
    bos_id: int
    eos_id: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # of the weights and the KV cache ("float32")
    opset: int
    max_context: int
    exported_with: dict[str, str] = field(default_factory=dict)  # package versions
    check_max_abs_logit_diff: float | None = None  # the export's own comparison with torch
    model: str = MODEL_NAME
    format: str = FORMAT

    @property
    def past_names(self) -> list[str]:
        return [f"past_key_values.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]

    @property
    def present_names(self) -> list[str]:
        return [f"present.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]

    def write(self, folder: Path) -> None:
        (Path(folder) / MANIFEST_NAME).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, folder: Path) -> OnnxManifest:
        path = Path(folder) / MANIFEST_NAME
        if not path.is_file():
            raise ManifestError(
                f"{folder} is not an ONNX export ({MANIFEST_NAME} missing): "
                f"make one with `specwire models export-onnx TARGET {folder}`")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ManifestError(f"cannot read {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ManifestError(f"{path} is format {found!r}, this specwire reads {FORMAT!r}: export the target again")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ManifestError(f"{path} is damaged ({exc}): export the target again") from exc


def is_onnx_export(path: Path) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()
