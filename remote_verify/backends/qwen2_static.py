"""Qwen2 written against a static KV cache: one slot per session, every row at its own position.

The forward pass of a serving engine in the gpt-fast manner: a few functions over the
Hugging Face model's own weight tensors (shared, not copied), and a KV cache allocated once
per layer as (slots + 1, S, kv_heads, head_dim). A pass is a padded batch: R rows (one per
session), T tokens each, row r's token t at position positions[r, t] of slot slots[r]. Its
keys and values are written into the cache first; then each query attends to the keys of
its own slot up to its own position (a boolean mask), so rows of different lengths share
one forward and padding never reaches a real row. The last slot is scratch: padding rows
of a CUDA graph write there. Position S - 1 of every slot is never valid, so padding
tokens of a real row write there (see torch_static.py).

Shapes: R rows, T tokens per row, L keys read per row (a bucket >= every row's last
position + 1), D model width, H query heads, G key/value heads (group = H / G query heads
share one), E head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


class NotPlainQwen2(ValueError):
    """A model the static path does not implement (the eager torch path serves it)."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("the static torch path implements plain Qwen2 only: " + "; ".join(problems)
                         + " (serve this target without --torch-static)")


@dataclass(frozen=True)
class Qwen2Shape:
    """What the forward needs from a transformers Qwen2Config."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float

    @classmethod
    def of(cls, config) -> Qwen2Shape:
        problems = []
        if getattr(config, "model_type", None) != "qwen2":
            problems.append(f"model_type is {getattr(config, 'model_type', None)!r}, not 'qwen2'")
        if getattr(config, "use_sliding_window", False):
            problems.append("sliding-window attention is on")
        scaling = getattr(config, "rope_scaling", None) or {}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            problems.append(f"rope scaling {scaling} is not implemented")
        if problems:
            raise NotPlainQwen2(problems)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get(
            "rope_theta", 10000.0)
        return cls(config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                   head_dim, float(config.rms_norm_eps), float(theta))


class StaticKV:
    """Keys and values of every slot, per layer: (slots + 1, S, G, E), allocated once."""

    @staticmethod
    def slot_bytes(shape: Qwen2Shape, positions: int, dtype: torch.dtype) -> int:
        """Bytes one slot of `positions` holds: keys and values of every layer."""
        return 2 * shape.layers * positions * shape.kv_heads * shape.head_dim * torch.empty((), dtype=dtype).element_size()

    def __init__(self, shape: Qwen2Shape, slots: int, positions: int, dtype: torch.dtype, device: torch.device):
        size = (slots + 1, positions, shape.kv_heads, shape.head_dim)
        # torch.empty: on the CPU pages a slot never writes are never touched, so a large
        # context costs address space, not memory, until sessions use it.
        self.keys = [torch.empty(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.values = [torch.empty(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.scratch_slot = slots
        self.positions = positions
        # Positions 0..touched[s]-1 of slot s hold finite numbers. A masked key still enters
        # attention as weight 0 times its value, and 0 * NaN (uninitialised memory) is NaN.
        self.touched = [0] * (slots + 1)

    def make_readable(self, slot: int, keys_read: int) -> None:
        """Zero the never-written positions of `slot` below `keys_read` (once per position)."""
        start = self.touched[slot]
        if start < keys_read:
            for cache in self.keys + self.values:
                cache[slot, start:keys_read].zero_()
            self.touched[slot] = keys_read


class StaticQwen2:
    """The forward pass of a Hugging Face Qwen2ForCausalLM, reading its weights in place."""

    def __init__(self, hf_model):
        self.shape = Qwen2Shape.of(hf_model.config)
        self.embed = hf_model.model.embed_tokens.weight  # (V, D)
        self.layers = hf_model.model.layers  # read-only: q/k/v/o, gate/up/down, two norms each
        self.norm = hf_model.model.norm.weight
        self.lm_head = hf_model.get_output_embeddings().weight  # (V, D), tied or not
        self.dtype = self.embed.dtype
        self.device = self.embed.device

    def rope_table(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (positions, E) in float32, computed once as transformers computes them
        (a position's angles never depend on what else is in the pass)."""
        e = self.shape.head_dim
        inv_freq = 1.0 / (self.shape.rope_theta ** (torch.arange(0, e, 2, dtype=torch.int64).float() / e))
        angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (S, E/2)
        angles = torch.cat((angles, angles), dim=-1)  # (S, E)
        return angles.cos().to(self.device), angles.sin().to(self.device)

    def hidden(self, kv: StaticKV, rope: tuple[torch.Tensor, torch.Tensor], tokens: torch.Tensor,
               slots: torch.Tensor, positions: torch.Tensor, keys_read: int, cells: torch.Tensor | None = None,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run R rows of T tokens; return the final-norm hidden states (R, T, D).

        tokens, positions: (R, T) int64; slots: (R,) int64. Writes every token's keys and
        values at (slots[r], positions[r, t]); reads keys 0..keys_read-1 of each row's slot.
        A tree of guesses (torch_static.py) gives each token a cell of its own apart from its
        rotary position (`cells`, (R, T): siblings share a position) and who sees whom (`mask`,
        (R, T, L) bool); without them a token's cell is its position and attention is causal.
        """
        cos = rope[0][positions].to(self.dtype)[:, :, None, :]  # (R, T, 1, E)
        sin = rope[1][positions].to(self.dtype)[:, :, None, :]
        cells = positions if cells is None else cells
        if mask is None:
            key_pos = torch.arange(keys_read, device=self.device)
            mask = key_pos[None, None, :] <= positions[:, :, None]  # (R, T, L): causal, per row
        group = self.shape.heads // self.shape.kv_heads
        mask = mask.repeat(1, group, 1)[:, None]  # (R, 1, group * T, L): see _attention
        x = F.embedding(tokens, self.embed)  # (R, T, D)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(layer, rms_norm(x, layer.input_layernorm.weight, self.shape.eps),
                                    kv.keys[i], kv.values[i], cos, sin, mask, slots, cells, keys_read)
            x = x + self._mlp(layer.mlp, rms_norm(x, layer.post_attention_layernorm.weight, self.shape.eps))
        return rms_norm(x, self.norm, self.shape.eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head)  # (..., V)

    def _attention(self, layer, x, k_cache, v_cache, cos, sin, mask, slots, cells, keys_read):
        a, s = layer.self_attn, self.shape
        r, t, _ = x.shape
        q = F.linear(x, a.q_proj.weight, a.q_proj.bias).view(r, t, s.heads, s.head_dim)
        k = F.linear(x, a.k_proj.weight, a.k_proj.bias).view(r, t, s.kv_heads, s.head_dim)
        v = F.linear(x, a.v_proj.weight, a.v_proj.bias).view(r, t, s.kv_heads, s.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache[slots[:, None], cells] = k  # (R, T, G, E) into each row's slot
        v_cache[slots[:, None], cells] = v
        keys = k_cache[slots, :keys_read].transpose(1, 2)  # (R, G, L, E): a gather of each row's slot
        values = v_cache[slots, :keys_read].transpose(1, 2)
        # The query heads that share a key/value head (head h uses h // group) become extra
        # query rows of that head, so attention reads each cached head once and no kernel
        # copies keys and values per query head (grouped-query attention's saving kept).
        group = s.heads // s.kv_heads
        q = q.transpose(1, 2).reshape(r, s.kv_heads, group * t, s.head_dim)  # (R, G, group * T, E)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (R, G, group * T, E)
        # reshape, not view: in float32 on CUDA the attention kernel hands back other strides
        out = out.reshape(r, s.heads, t, s.head_dim).transpose(1, 2)  # (R, T, H, E)
        return F.linear(out.reshape(r, t, s.heads * s.head_dim), a.o_proj.weight)

    @staticmethod
    def _mlp(mlp, x):
        return F.linear(F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight),
                        mlp.down_proj.weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # in float32 and cast back before the weight, as transformers' Qwen2RMSNorm does
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, halves layout (Qwen2's): x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
