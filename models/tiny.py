"""The tiny test-model factory: a Qwen2 target and two GGUF drafters, built from a seed.

    DIR/target/         Hugging Face Qwen2ForCausalLM (float32 safetensors + tokenizer)
    DIR/target.gguf     the same target as an F32 GGUF, for the llama.cpp backend
    DIR/draft.gguf      the target itself, quantized: close, high but not full acceptance
    DIR/draft-far.gguf  unrelated weights of the same shape: low acceptance

Weights are random but scaled so that the output distributions are peaked: the gap
between the two largest logits is usually far above float rounding, so a greedy choice
never depends on the order of a matrix multiplication.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from models.byte_bpe import ByteBPEVocab, build_vocab
from models.gguf_export import CHAT_TEMPLATE, write_qwen2_gguf

log = logging.getLogger(__name__)

TINY_CONFIG = dict(
    hidden_size=64,  # a multiple of 32, the quantization block size
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
LOGIT_SCALE = 6.0  # std of the logits: peaked, yet sampling at temperature 1 still varies
# Q5_0: coarse enough to disagree now and then. (Q4_0 and Q8_0 crash llama.cpp's CPU
# weight repacking at these tiny shapes.)
CLOSE_DRAFT_TYPE = gguf.GGMLQuantizationType.Q5_0
# Embeddings and output head stay F16: the draft agrees with the target's argmax ~90% of
# the time instead of ~85%, about what a real same-family pair does on easy text.
CLOSE_DRAFT_F16 = frozenset({"model.embed_tokens.weight", "lm_head.weight"})


@dataclass(frozen=True)
class TinyModels:
    target: Path
    target_gguf: Path
    draft: Path
    draft_far: Path


def build_tiny_models(out_dir: Path, seed: int = 0) -> TinyModels:
    """Write the tiny target and both drafters under out_dir; deterministic in seed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = build_vocab()
    target_tensors = _random_weights(vocab, seed)
    far_tensors = _random_weights(vocab, seed + 1_000_003)

    paths = TinyModels(out_dir / "target", out_dir / "target.gguf", out_dir / "draft.gguf",
                       out_dir / "draft-far.gguf")
    _save_hf_target(paths.target, target_tensors, vocab)
    write_qwen2_gguf(paths.target_gguf, _config(vocab), target_tensors, vocab,
                     gguf.GGMLQuantizationType.F32, name="specwire-tiny-target")
    write_qwen2_gguf(paths.draft, _config(vocab), target_tensors, vocab, CLOSE_DRAFT_TYPE,
                     name="specwire-tiny-draft", f16_tensors=CLOSE_DRAFT_F16)
    write_qwen2_gguf(paths.draft_far, _config(vocab), far_tensors, vocab,
                     gguf.GGMLQuantizationType.F16, name="specwire-tiny-draft-far")
    return paths


def _config(vocab: ByteBPEVocab) -> dict:
    return dict(TINY_CONFIG, vocab_size=vocab.size)


def _random_weights(vocab: ByteBPEVocab, seed: int) -> dict[str, np.ndarray]:
    """Hugging Face Qwen2 tensor names -> float32 arrays (out, in)."""
    rng = np.random.default_rng(seed)
    c = _config(vocab)
    hidden, ffn, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    head_dim = hidden // c["num_attention_heads"]
    kv_dim = head_dim * c["num_key_value_heads"]

    def linear(out_dim: int, in_dim: int) -> np.ndarray:
        # 1/sqrt(fan_in) keeps activations at unit scale through the stack
        return rng.normal(0.0, 1.0 / np.sqrt(in_dim), (out_dim, in_dim)).astype(np.float32)

    def bias(dim: int) -> np.ndarray:
        return rng.normal(0.0, 0.1, dim).astype(np.float32)

    tensors = {"model.embed_tokens.weight": rng.normal(0.0, 1.0, (vocab.size, hidden)).astype(np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
        tensors[p + "self_attn.q_proj.weight"] = linear(hidden, hidden)
        tensors[p + "self_attn.q_proj.bias"] = bias(hidden)
        tensors[p + "self_attn.k_proj.weight"] = linear(kv_dim, hidden)
        tensors[p + "self_attn.k_proj.bias"] = bias(kv_dim)
        tensors[p + "self_attn.v_proj.weight"] = linear(kv_dim, hidden)
        tensors[p + "self_attn.v_proj.bias"] = bias(kv_dim)
        tensors[p + "self_attn.o_proj.weight"] = linear(hidden, hidden)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
        tensors[p + "mlp.gate_proj.weight"] = linear(ffn, hidden)
        tensors[p + "mlp.up_proj.weight"] = linear(ffn, hidden)
        tensors[p + "mlp.down_proj.weight"] = linear(hidden, ffn)
    tensors["model.norm.weight"] = np.ones(hidden, dtype=np.float32)
    # After the final RMS norm the hidden state has unit scale, so this sets the logit std.
    lm_head = rng.normal(0.0, LOGIT_SCALE / np.sqrt(hidden), (vocab.size, hidden)).astype(np.float32)
    lm_head[vocab.bos_id] = 0.0  # the model never predicts the start marker
    lm_head[vocab.eos_id] *= 0.6  # end of text: possible when sampling, rare under greedy
    tensors["lm_head.weight"] = lm_head
    return tensors


def _save_hf_target(target_dir: Path, tensors: dict[str, np.ndarray], vocab: ByteBPEVocab) -> None:
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    target_dir.mkdir(parents=True, exist_ok=True)
    c = _config(vocab)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab.size,
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "max_position_embeddings": c["max_position_embeddings"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_theta": c["rope_theta"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.eos_id,
        "torch_dtype": "float32",
    }
    (target_dir / "config.json").write_text(json.dumps(config, indent=2))
    (target_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": vocab.bos_id, "eos_token_id": vocab.eos_id}, indent=2)
    )
    save_file({k: torch.from_numpy(v) for k, v in tensors.items()},
              str(target_dir / "model.safetensors"), metadata={"format": "pt"})

    normal = {text: i for i, text in enumerate(vocab.tokens[: vocab.n_normal])}
    merges = [tuple(m.split(" ")) for m in vocab.merges]
    tokenizer = Tokenizer(models.BPE(vocab=normal, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(vocab.tokens[vocab.n_normal:])
    tokenizer.save(str(target_dir / "tokenizer.json"))
    (target_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": vocab.tokens[vocab.bos_id],
        "eos_token": vocab.tokens[vocab.eos_id],
        "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
