"""A target's vocabulary as a GGUF file with no tensors, for clients that have no model file.

llama.cpp loads such a file with `vocab_only=True` and tokenizes, detokenizes and reads the
chat template exactly as the full model does: the tokenizer is nothing but the file's
metadata. So the file is every metadata key/value of the target's GGUF (the architecture's
hyper-parameters too, which llama.cpp reads before the vocabulary), and no tensor.

Where the vocabulary comes from (`write_target_vocab_gguf`):
- a GGUF target: the file itself;
- the torch backend's de-quantized copy of a GGUF (models/gguf_to_hf.py): the GGUF it was
  made from, named in the folder's marker;
- an ONNX export (models/onnx_manifest.py): what it was exported from, by these rules;
- any other Hugging Face folder: written from its tokenizer.json and config.json, for the
  tokenizers whose llama.cpp form is known without llama.cpp's converter: a Qwen2 model
  with a byte-level BPE tokenizer whose pre-tokenizer is Qwen2's split (llama.cpp "qwen2")
  or GPT-2's (llama.cpp "gpt-2", as the tiny test target's). llama.cpp's converter names
  other pre-tokenizers by hashing how they split a probe text; guessing instead could
  tokenize differently from the target, which is worse than no file, so any other folder
  gets NoVocabFile with a message saying to serve the target's GGUF.
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


def write_target_vocab_gguf(target: Path, out: Path) -> tuple[Path, list[bytes]]:
    """Write `target`'s vocabulary file to `out`; returns what it was made from and the token texts."""
    try:
        source = vocab_gguf_source(target)
    except NoVocabFile:
        folder = _hf_folder_behind(Path(target))
        return folder, write_hf_vocab_gguf(folder, out)
    return source, write_vocab_gguf(source, out)


def _hf_folder_behind(target: Path) -> Path:
    from models.onnx_manifest import OnnxManifest, is_onnx_export

    while is_onnx_export(target):
        target = Path(OnnxManifest.read(target).source)
    return target


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
    raise NoVocabFile(f"the target {target} is a Hugging Face folder with no GGUF file behind it")


# Qwen2's pre-tokenizer split, as its tokenizer.json writes it (llama.cpp: "qwen2")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
SERVE_THE_GGUF = ("serve the target as a GGUF file (`specwire serve --target MODEL.gguf`, with --backend torch "
                  "for PyTorch), or give the client a GGUF of the same model")


def write_hf_vocab_gguf(folder: Path, out: Path) -> list[bytes]:
    """Write the vocabulary of a Hugging Face Qwen2 folder (byte-level BPE) as a tensor-free GGUF.

    Token ids and texts are those the service fingerprints (models/vocab.py: the tokenizer's
    vocabulary and added tokens, "[PAD<id>]" up to the output layer's size); added tokens are
    control tokens when special and user-defined otherwise, padding ids unused, as llama.cpp's
    converter writes them. Returns the token texts.
    """
    from models.gguf_export import add_byte_bpe_tokenizer, add_qwen2_hyperparameters
    from models.vocab import hf_token_texts

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        settings_file = folder / "tokenizer_config.json"
        settings = json.loads(settings_file.read_text(encoding="utf-8")) if settings_file.is_file() else {}
    except (OSError, ValueError) as exc:
        raise NoVocabFile(f"cannot read the tokenizer of {folder} ({exc}): {SERVE_THE_GGUF}") from exc
    if config.get("model_type") != "qwen2" or tokenizer.get("model", {}).get("type") != "BPE":
        raise NoVocabFile(f"{folder} is a {config.get('model_type')} model with a "
                          f"{tokenizer.get('model', {}).get('type')} tokenizer; the service writes vocabulary files "
                          f"for Qwen2 byte-level BPE folders only: {SERVE_THE_GGUF}")
    pre = _llama_pre_tokenizer(tokenizer.get("pre_tokenizer"), tokenizer.get("normalizer"))
    if pre is None:
        raise NoVocabFile(f"the pre-tokenizer of {folder}/tokenizer.json is not one whose llama.cpp name is known "
                          f"without llama.cpp's converter: {SERVE_THE_GGUF}")
    texts = hf_token_texts(folder, int(config["vocab_size"]))
    normal = set(tokenizer["model"]["vocab"].values())
    added = {int(token["id"]): bool(token.get("special")) for token in tokenizer.get("added_tokens", [])}
    types = [gguf.TokenType.CONTROL if added.get(i) else gguf.TokenType.USER_DEFINED if i in added
             else gguf.TokenType.NORMAL if i in normal else gguf.TokenType.UNUSED for i in range(len(texts))]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in tokenizer["model"]["merges"]]
    ids = {text.decode("utf-8"): i for i, text in enumerate(texts)}
    bos_id = _special_id(settings.get("bos_token"), ids, config.get("bos_token_id"))
    eos_id = _special_id(settings.get("eos_token"), ids, config.get("eos_token_id"))
    writer = gguf.GGUFWriter(str(out), "qwen2")
    # transformers 5 keeps rope_theta under rope_parameters; a vocabulary-only load reads but never uses it
    rope_theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    add_qwen2_hyperparameters(writer, dict(config, rope_theta=rope_theta), folder.name)
    add_byte_bpe_tokenizer(writer, texts, types, merges, bos_id, eos_id, add_bos=bool(settings.get("add_bos_token")),
                           pre=pre, chat_template=settings.get("chat_template"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()  # none
    writer.close()
    log.info("wrote the vocabulary of %s to %s (%d tokens, pre-tokenizer %s)", folder, out, len(texts), pre)
    return texts


def _llama_pre_tokenizer(pre_tokenizer: dict | None, normalizer: dict | None) -> str | None:
    """llama.cpp's name for a tokenizer.json pre-tokenizer, for the two byte-level ones known here."""
    if normalizer not in (None, {"type": "NFC"}) or not pre_tokenizer:
        return None
    if pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True) \
            and not pre_tokenizer.get("add_prefix_space"):
        return "gpt-2"  # GPT-2's own split inside ByteLevel
    steps = pre_tokenizer.get("pretokenizers", []) if pre_tokenizer.get("type") == "Sequence" else []
    if len(steps) == 2 and steps[0].get("type") == "Split" and steps[0].get("pattern", {}).get("Regex") == QWEN2_SPLIT \
            and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert") \
            and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex", True) \
            and not steps[1].get("add_prefix_space"):
        return "qwen2"
    return None


def _special_id(token, ids: dict[str, int], fallback) -> int:
    """The id of a special token named in tokenizer_config.json (a string or {"content": ...})."""
    text = token.get("content") if isinstance(token, dict) else token
    if isinstance(text, str) and text in ids:
        return ids[text]
    if isinstance(fallback, list):
        fallback = fallback[0] if fallback else None
    if fallback is None:
        raise NoVocabFile("the tokenizer names no BOS/EOS token and config.json gives no id: " + SERVE_THE_GGUF)
    return int(fallback)


# struct formats of GGUF's fixed-size value types (gguf-py's own table, by type)
_FORMATS = {gguf.GGUFValueType.UINT8: "B", gguf.GGUFValueType.INT8: "b", gguf.GGUFValueType.UINT16: "H",
            gguf.GGUFValueType.INT16: "h", gguf.GGUFValueType.UINT32: "I", gguf.GGUFValueType.INT32: "i",
            gguf.GGUFValueType.FLOAT32: "f", gguf.GGUFValueType.BOOL: "?", gguf.GGUFValueType.UINT64: "Q",
            gguf.GGUFValueType.INT64: "q", gguf.GGUFValueType.FLOAT64: "d"}
MetadataItem = tuple[str, gguf.GGUFValueType, object, "gguf.GGUFValueType | None"]  # key, type, value, array's type


def read_metadata(source: Path) -> list[MetadataItem]:
    """Every metadata key/value of a (little-endian, v2 or v3) GGUF file, in file order.

    gguf-py's GGUFReader takes 12 s for a Qwen2.5 file (it makes a numpy view of each of
    the 450,000 strings and numbers in the token lists); this reads them with struct in
    0.3 s, without touching the tensors.
    """
    try:
        return _read_metadata(source)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:  # ValueError: an empty file, an unknown type
        raise NoVocabFile(f"{source} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def _read_metadata(source: Path) -> list[MetadataItem]:
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
        # split.*: how a large model's tensors are spread over files; this file has none of them
        if key == gguf.Keys.General.ARCHITECTURE or key.startswith("split."):
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
