"""One minimal decoder for the Llama family: Llama, Qwen2 (qkv bias) and Qwen3 (q/k RMSNorm).

RMSNorm, RoPE, grouped-query attention and a SwiGLU MLP. Parameter names mirror Hugging Face's, so a
checkpoint's state dict loads as is. The decoder knows nothing about caches or attention methods:
each layer hands its post-RoPE q, k, v to an `attend(layer, q, k, v)` callable the engine supplies,
which stores k/v and returns the attention output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from sfibench.metrics.labels import label
from sfibench.models import fused
from sfibench.models.presets import ModelConfig
from sfibench.models.rope import inverse_frequencies, rope_cos_sin

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.ops["rms_norm"](x, self.weight, self.eps)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        if cfg.qk_norm:  # Qwen3 normalises each head's q and k before RoPE
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x, cos, sin, layer: int, attend: Attend) -> torch.Tensor:
        batch, seq, _ = x.shape
        with label("sfibench.projections"):  # a label for `sfibench profile`
            q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim)
            k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
            v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = fused.ops["apply_rope"](q.transpose(1, 2), cos, sin)
        k = fused.ops["apply_rope"](k.transpose(1, 2), cos, sin)
        out = attend(layer, q, k, v.transpose(1, 2))  # [B, H_q, T, D]
        with label("sfibench.projections"):
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with label("sfibench.mlp"):  # a label for `sfibench profile`
            return self.down_proj(fused.ops["silu_mul"](self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layer: int, attend: Attend) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, layer, attend)
        norm = self.post_attention_layernorm
        x, normed = fused.ops["add_rms_norm"](attended, x, norm.weight, norm.eps)
        return x + self.mlp(normed)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        inv_freq, amplitude = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_dict())
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_amplitude = amplitude

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the checkpoint does (`to_empty` unties them)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend,
                last_only: bool = False) -> torch.Tensor:
        """tokens and positions `[B, T]` -> logits `[B, T, V]` (or `[B, 1, V]` with last_only)."""
        x = self.model.embed_tokens(tokens)
        cos, sin = rope_cos_sin(self.inv_freq, self.rope_amplitude, positions, x.dtype)
        for index, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, index, attend)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.model.norm(x)).float()
