"""Write a Qwen2-architecture model (Hugging Face tensor names) as a GGUF file llama.cpp loads.

Qwen2 needs no Q/K permutation (llama.cpp applies NEOX-style rotary embeddings, the same
layout Hugging Face uses), so tensors are renamed and, for matrices, optionally quantized.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

import gguf
import numpy as np

from models.byte_bpe import ByteBPEVocab

log = logging.getLogger(__name__)

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model . layers . N . rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_NAMES:
        return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"
    raise ValueError(f"no GGUF name for tensor {hf_name!r}")


def write_qwen2_gguf(
    path: Path,
    config: Mapping[str, float | int],
    tensors: Mapping[str, np.ndarray],
    vocab: ByteBPEVocab,
    matrix_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    name: str = "specwire-tiny",
    f16_tensors: frozenset[str] = frozenset(),
) -> None:
    """config keys follow Hugging Face's Qwen2Config; tensors are float32 arrays.

    Matrices are stored as `matrix_type`, except those named in `f16_tensors`.
    """
    writer = gguf.GGUFWriter(str(path), "qwen2")
    add_qwen2_hyperparameters(writer, config, name)
    writer.add_file_type(_file_type(matrix_type))
    token_types = [gguf.TokenType.NORMAL] * vocab.n_normal
    token_types += [gguf.TokenType.CONTROL] * (vocab.size - vocab.n_normal)
    add_byte_bpe_tokenizer(writer, vocab.tokens, token_types, vocab.merges, vocab.bos_id, vocab.eos_id,
                           add_bos=True, pre="qwen2", chat_template=CHAT_TEMPLATE)

    for hf_name, array in tensors.items():
        array = np.ascontiguousarray(array, dtype=np.float32)
        if array.ndim == 2 and matrix_type != gguf.GGMLQuantizationType.F32:
            if matrix_type == gguf.GGMLQuantizationType.F16 or hf_name in f16_tensors:
                writer.add_tensor(gguf_name(hf_name), array.astype(np.float16))
            else:
                quantized = gguf.quants.quantize(array, matrix_type)
                writer.add_tensor(gguf_name(hf_name), quantized, raw_dtype=matrix_type)
        else:
            writer.add_tensor(gguf_name(hf_name), array)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log.info("wrote %s", path)


def add_qwen2_hyperparameters(writer: gguf.GGUFWriter, config: Mapping[str, float | int], name: str) -> None:
    """The Qwen2 shape keys llama.cpp reads before anything else (a vocabulary-only load too)."""
    writer.add_name(name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))


def add_byte_bpe_tokenizer(writer: gguf.GGUFWriter, tokens: Sequence[str | bytes], token_types: Sequence[int],
                           merges: Sequence[str], bos_id: int, eos_id: int, add_bos: bool, pre: str,
                           chat_template: str | None) -> None:
    """A byte-level BPE tokenizer as llama.cpp's `gpt2` model reads it; `pre` names its pre-tokenizer."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos_id)
    writer.add_eos_token_id(eos_id)
    writer.add_add_bos_token(add_bos)
    if chat_template:
        writer.add_chat_template(chat_template)


def _file_type(matrix_type: gguf.GGMLQuantizationType) -> int:
    return {
        gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
        gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16,
        gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
        gguf.GGMLQuantizationType.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0,
        gguf.GGMLQuantizationType.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
    }[matrix_type]


# A ChatML-style template (the Qwen family's), so chat works on tiny models as on real ones.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
