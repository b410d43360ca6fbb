"""The Gemma-3 text decoder, built from the Llama family's pieces (models/decoder.py).

What differs from Llama, every number taken from the checkpoint's config:
- the embeddings are scaled by sqrt(hidden) (rounded to the weights' dtype, as transformers does);
- RMSNorm scales by (1 + w). The weight is stored here as 1 + w, so the Llama norm and its fused
  kernels apply it unchanged; state-dict hooks add 1 on load and take it off on save, so checkpoints
  and transformers see Gemma's own w. (In bf16 the stored 1 + w is rounded once, where transformers
  adds in float32: a last-bit difference, none in float32.)
- four norms per layer: the attention and MLP outputs are each normalised before they join the
  residual stream (post-attention, post-feedforward), besides the usual norms before them;
- q/k RMSNorm per head (as Qwen3), and the attention scale query_pre_attn_scalar^-0.5: q is
  multiplied by sqrt(head_dim / query_pre_attn_scalar) before `attend`, so every method's
  1/sqrt(head_dim) softmax (and SFI's evidence logits) gets Gemma's scale without knowing about it;
- GeGLU (gelu with the tanh approximation) in place of SwiGLU;
- RoPE base `rope_local_theta` on sliding-window layers, `rope_theta` (with its scaling) on global ones;
- optional final-logit soft-capping.

Which layers slide is `ModelConfig.layer_is_global`; the model hands every layer's q, k, v to `attend`
like the Llama decoder, and the engine answers a sliding layer over its window (engine/sliding.py).
"""

from __future__ import annotations

import torch
from torch import nn

from sfibench.models import fused
from sfibench.models.decoder import MLP, Attend, Decoder, RMSNorm, SelfAttention
from sfibench.models.presets import ModelConfig, rope_scaling_tuple
from sfibench.models.rope import inverse_frequencies

HF_MODEL_TYPE = "gemma3_text"
GLOBAL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer_types values


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(h, eps)  # on the attention output (Llama's name, not role)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.mlp = MLP(cfg, activation="gelu_tanh_mul")
        self.post_feedforward_layernorm = RMSNorm(h, eps)

    def forward(self, residual, normed, cos, sin, layer: int, attend: Attend, next_norm: RMSNorm):
        """As DecoderLayer.forward: the residual stream and its input norm in, the stream after this layer
        and its norm by `next_norm` out. Gemma normalises each block's output before adding it, so the
        adds stay separate kernels (add_rms_norm) rather than epilogues of the products."""
        attended = self.post_attention_layernorm(self.self_attn(normed, cos, sin, layer, attend))
        norm = self.pre_feedforward_layernorm
        residual, normed = fused.ops["add_rms_norm"](attended, residual, norm.weight, norm.eps)
        mlp_out = self.post_feedforward_layernorm(self.mlp(normed))
        return fused.ops["add_rms_norm"](mlp_out, residual, next_norm.weight, next_norm.eps)


class Gemma3Decoder(Decoder):
    layer_class = Gemma3Layer

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.register_load_state_dict_pre_hook(_norm_weights_plus_one)
        self.register_state_dict_post_hook(_norm_weights_minus_one)
        pre_attn_scalar = cfg.query_pre_attn_scalar or cfg.head_dim
        self.query_scale = (cfg.head_dim / pre_attn_scalar) ** 0.5  # on top of attend's 1/sqrt(head_dim)

    def init_buffers(self, device=None) -> None:
        super().init_buffers(device)  # the global layers' RoPE
        cfg = self.config
        self.register_buffer("local_inv_freq", inverse_frequencies(cfg.head_dim, cfg.rope_local_theta, None)[0]
                             .to(device), persistent=False)
        dtype = self.model.embed_tokens.weight.dtype
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size ** 0.5, device=device).to(dtype),
                             persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend,
                last_only: bool = False) -> torch.Tensor:
        if self.query_scale != 1.0:  # 1.0 for the released checkpoints: skip the extra multiply
            inner, scale = attend, self.query_scale

            def attend(layer, q, k, v):
                return inner(layer, q * scale, k, v)

            if hasattr(inner, "append_target"):  # decode: the layers still append their own k/v
                attend.append_target = inner.append_target

        return super().forward(tokens, positions, attend, last_only)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens) * self.embed_scale

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        global_table = self.rope_cos_sin(self.inv_freq, self.rope_amplitude, positions, dtype)
        local_table = self.rope_cos_sin(self.local_inv_freq, 1.0, positions, dtype)
        return [global_table if self.config.is_global(layer) else local_table
                for layer in range(self.config.num_layers)]

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        logits = super().head(normed)
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits


def _norm_weights_plus_one(_module, state, prefix, *_):
    for key in [k for k in state if k.startswith(prefix) and k.endswith("norm.weight")]:
        state[key] = state[key] + 1  # a new tensor: the caller's state dict stays Gemma's w


def _norm_weights_minus_one(_module, state, prefix, _metadata):
    for key in [k for k in state if k.startswith(prefix) and k.endswith("norm.weight")]:
        state[key] = state[key] - 1


def config_from_hf(hf: dict, name: str, source: str) -> ModelConfig:
    """A Gemma-3 text config (transformers' dict, or a checkpoint's config.json) -> ModelConfig."""
    if hf.get("attn_logit_softcapping"):
        raise ValueError("attention-logit soft-capping (Gemma-2) is not supported: every method's softmax "
                         "would need it; Gemma-3 checkpoints have none")
    if hf.get("hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"Gemma-3 MLP activation {hf['hidden_activation']!r} is not supported (gelu tanh is)")
    num_layers = hf["num_hidden_layers"]
    layer_types = hf.get("layer_types") or [
        GLOBAL if (layer + 1) % hf["sliding_window_pattern"] == 0 else SLIDING for layer in range(num_layers)
    ]
    global_rope, local_rope = _rope_parameters(hf)
    heads = hf["num_attention_heads"]
    return ModelConfig(
        name=name, arch="gemma3", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=num_layers, num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hf["head_dim"],
        max_context=hf["max_position_embeddings"], rope_theta=float(global_rope.pop("rope_theta")),
        rope_scaling=rope_scaling_tuple(global_rope), rope_local_theta=float(local_rope["rope_theta"]),
        rms_norm_eps=hf["rms_norm_eps"], tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        qkv_bias=bool(hf.get("attention_bias", False)), qk_norm=True, sliding_window=hf["sliding_window"],
        layer_is_global=tuple(kind == GLOBAL for kind in layer_types),
        query_pre_attn_scalar=int(hf["query_pre_attn_scalar"]),
        final_logit_softcapping=float(hf.get("final_logit_softcapping") or 0.0), source=source,
    )


def _rope_parameters(hf: dict) -> tuple[dict, dict]:
    """(global, local) RoPE parameters. transformers 5 keeps them per layer type in `rope_parameters`;
    a checkpoint's config.json has `rope_theta`, `rope_local_base_freq` and `rope_scaling` instead."""
    per_type = hf.get("rope_parameters") or {}
    if GLOBAL in per_type:
        global_rope, local_rope = dict(per_type[GLOBAL]), dict(per_type[SLIDING])
    else:
        global_rope = {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1e6)}
        local_rope = {"rope_theta": hf.get("rope_local_base_freq", 1e4)}
    if local_rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope scaling on Gemma-3's sliding layers is not supported: {local_rope}")
    if global_rope.get("rope_type", global_rope.get("type", "default")) == "default":
        global_rope = {"rope_theta": global_rope["rope_theta"]}
    return global_rope, local_rope
