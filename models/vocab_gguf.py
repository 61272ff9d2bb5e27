"""A target's vocabulary as a GGUF file with no tensors, for clients that have no model file.

llama.cpp loads such a file with `vocab_only=True` and tokenizes, detokenizes and reads the
chat template exactly as the full model does: the tokenizer is nothing but the file's
metadata. So the file is every metadata key/value of the target's GGUF (the architecture's
hyper-parameters too, which llama.cpp reads before the vocabulary), and no tensor.

Where the vocabulary comes from (`vocab_gguf_source`):
- a GGUF target: the file itself;
- the torch backend's de-quantized copy of a GGUF (models/gguf_to_hf.py): the GGUF it was
  made from, named in the folder's marker;
- an ONNX export (models/onnx_manifest.py): what it was exported from, by the same rules;
- any other Hugging Face folder: none. Writing a llama.cpp tokenizer from tokenizer.json
  takes llama.cpp's own converter (which names the pre-tokenizer by hashing how the
  tokenizer splits a probe text); a vocabulary written without it could tokenize
  differently from the target, which is worse than none. Such a target is served with a
  message that says to serve its GGUF (or a folder converted from one) instead.
"""

from __future__ import annotations

import json
import logging
import mmap
import struct
from pathlib import Path

import gguf

log = logging.getLogger(__name__)


class NoVocabFile(Exception):
    """The target's vocabulary cannot be offered as a GGUF file; the message says what to do."""


def vocab_gguf_source(target: Path) -> Path:
    """The GGUF file whose metadata holds `target`'s tokenizer; NoVocabFile when there is none."""
    from models.gguf_to_hf import MARKER
    from models.onnx_manifest import OnnxManifest, is_onnx_export

    target = Path(target)
    seen: set[Path] = set()
    while target not in seen:  # an export of a converted GGUF: two steps back to the file
        seen.add(target)
        if target.is_file():
            return target
        if is_onnx_export(target):
            target = Path(OnnxManifest.read(target).source)
            continue
        marker = target / MARKER
        if marker.is_file():
            target = Path(json.loads(marker.read_text(encoding="utf-8"))["source"])
            continue
        break
    raise NoVocabFile(
        f"the target {target} is a Hugging Face folder with no GGUF file behind it, so the service has no "
        "llama.cpp vocabulary to send: serve the target as a GGUF file (`specwire serve --target "
        "MODEL.gguf`, with --backend torch if you want PyTorch), or give the client a GGUF of the same model")


# struct formats of GGUF's fixed-size value types (gguf-py's own table, by type)
_FORMATS = {gguf.GGUFValueType.UINT8: "B", gguf.GGUFValueType.INT8: "b", gguf.GGUFValueType.UINT16: "H",
            gguf.GGUFValueType.INT16: "h", gguf.GGUFValueType.UINT32: "I", gguf.GGUFValueType.INT32: "i",
            gguf.GGUFValueType.FLOAT32: "f", gguf.GGUFValueType.BOOL: "?", gguf.GGUFValueType.UINT64: "Q",
            gguf.GGUFValueType.INT64: "q", gguf.GGUFValueType.FLOAT64: "d"}
MetadataItem = tuple[str, gguf.GGUFValueType, object, "gguf.GGUFValueType | None"]  # key, type, value, array's type


def read_metadata(source: Path) -> list[MetadataItem]:
    """Every metadata key/value of a (little-endian, v2 or v3) GGUF file, in file order.

    gguf-py's GGUFReader takes 12 s for a Qwen2.5 file (it makes a numpy view of each of
    the 450,000 strings and numbers in the token lists); this reads them with struct, in
    about a second, without touching the tensors.
    """
    with open(source, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise NoVocabFile(f"{source} is not a GGUF file")
        version, _, n_kv = struct.unpack_from("<IQQ", data, 4)
        if version not in (2, 3):
            raise NoVocabFile(f"{source} is GGUF version {version} (or big-endian): re-save it as version 3")
        at = 24

        def read(fmt: str):
            nonlocal at
            values = struct.unpack_from("<" + fmt, data, at)
            at += struct.calcsize("<" + fmt)
            return values

        def read_string() -> bytes:
            nonlocal at
            (length,) = read("Q")
            at += length
            return data[at - length:at]

        def read_value(value_type: gguf.GGUFValueType):
            if value_type == gguf.GGUFValueType.STRING:
                return read_string()
            return read(_FORMATS[value_type])[0]

        items: list[MetadataItem] = []
        for _ in range(n_kv):
            key = read_string().decode("utf-8")
            value_type = gguf.GGUFValueType(read("I")[0])
            sub_type = None
            if value_type == gguf.GGUFValueType.ARRAY:
                sub_type = gguf.GGUFValueType(read("I")[0])
                (count,) = read("Q")
                if sub_type in _FORMATS:
                    value = list(read(f"{count}{_FORMATS[sub_type]}"))
                elif sub_type == gguf.GGUFValueType.STRING:
                    value = [read_string() for _ in range(count)]
                else:
                    raise NoVocabFile(f"{source}: {key} is an array of arrays, which this reader does not copy")
            else:
                value = read_value(value_type)
            items.append((key, value_type, value, sub_type))
        return items


def write_vocab_gguf(source: Path, out: Path) -> list[bytes]:
    """Write every metadata key/value of the GGUF `source` to `out` (with gguf-py), and no tensor.

    Returns the token texts in id order (what the vocabulary fingerprint hashes)."""
    items = read_metadata(source)
    keys = {key: value for key, _, value, _ in items}
    if gguf.Keys.Tokenizer.LIST not in keys:
        raise NoVocabFile(f"{source} has no tokenizer ({gguf.Keys.Tokenizer.LIST} is missing)")
    architecture = keys[gguf.Keys.General.ARCHITECTURE]
    writer = gguf.GGUFWriter(str(out), architecture.decode("utf-8"))  # writes general.architecture itself
    for key, value_type, value, sub_type in items:
        if key == gguf.Keys.General.ARCHITECTURE:
            continue
        if value_type == gguf.GGUFValueType.ARRAY and not value:
            log.warning("%s: leaving out the empty array %s (a GGUF writer cannot write one)", source.name, key)
            continue
        writer.add_key_value(key, value, value_type, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()  # none
    writer.close()
    log.info("wrote the vocabulary of %s to %s (%d keys)", source.name, out, len(items))
    return keys[gguf.Keys.Tokenizer.LIST]
