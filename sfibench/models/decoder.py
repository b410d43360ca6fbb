"""One minimal decoder for the Llama family: Llama, Qwen2 (qkv bias) and Qwen3 (q/k RMSNorm).

Gemma-3 (models/gemma3.py) is built from the same pieces and overrides the hooks of `Decoder`
(`layer_class`, `embed`, `rope_tables`, `init_buffers`, `head`).

RMSNorm, RoPE, grouped-query attention and a SwiGLU MLP. The decoder knows nothing about caches or
attention methods: each layer hands its post-RoPE q, k, v to an `attend(layer, q, k, v)` callable the
engine supplies, which stores k/v and returns the attention output. At decode the engine may instead
name the cache slots (`attend.append_target(layer)`): the layer then writes k/v there itself, in the
kernel that rotates them, and calls `attend(layer, q, None, None)`.

Laid out for few kernels per decode step, where launches, not bytes, cost: q/k/v and gate/up are each
one GEMM over stacked weights (the state dict still uses Hugging Face's names, so checkpoints and
transformers load and compare as is), and each residual add is folded into the RMSNorm after it, which
is folded into the product before it: a layer takes the residual stream and its input norm and returns
the next pair, normed by the next layer's input norm (the last layer's by the final norm). With fusion
on (models/fused.py) a layer's decode step is 6 launches plus attention: qkv GEMV, q/k norm+RoPE with
the cache append, o_proj with the residual add and the post-attention norm, gate_up with silu*mul,
down_proj, and the residual add with the next input norm (the GEMVs are optimized/gemv.py's, the ops
after two of them its epilogues). It was 8 before the epilogues, 20 before any fusion: norm, 3 GEMMs,
2 q/k norms, 2 RoPEs, 5 for the cache append (3 scatters, a cast, a norm), o_proj, add+norm, 2 GEMMs,
silu*mul, down_proj and the residual add. The qkv product carries the q/k kernel by default
(optimized/qkv_epilogue.py: 5 plus attention), and with the input norm folded into it
(`Decoder.fold_input_norms`, on GPUs where down_proj has its Triton epilogue: `fold_pays`) the add + norm
after down_proj goes too: 4 plus attention. The post-attention norm folds into gate_up the same way, so
o_proj's epilogue no longer has a last program normalise whole rows while the others wait.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from sfibench.core.labels import label
from sfibench.models import fused
from sfibench.models.presets import ModelConfig
from sfibench.models.rope import PositionTable, inverse_frequencies, rope_cos_sin

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.ops["rms_norm"](x, self.weight, self.eps)


def hf_names_for_stacked(module: nn.Module, stacked: str, parts: dict[str, int]) -> None:
    """Keep the Hugging Face names for a projection stored stacked, e.g. `qkv_proj` for q/k/v_proj.

    One GEMM over weights stacked by output rows replaces several over the same input. Hooks stack
    the separate `parts` (name -> output rows) of a state dict on load and split them again (as
    views, no copy) on save, so checkpoints and transformers see the usual layout.
    """

    def stack(_module, state, prefix, *_):
        for suffix in ("weight", "bias"):
            keys = [f"{prefix}{name}.{suffix}" for name in parts]
            if all(key in state for key in keys):
                state[f"{prefix}{stacked}.{suffix}"] = torch.cat([state.pop(key) for key in keys])

    def split(_module, state, prefix, _metadata):
        for suffix in ("weight", "bias"):
            key = f"{prefix}{stacked}.{suffix}"
            if key in state:
                for name, rows in zip(parts, state.pop(key).split(list(parts.values()))):
                    state[f"{prefix}{name}.{suffix}"] = rows

    module.register_load_state_dict_pre_hook(stack)
    module.register_state_dict_post_hook(split)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        parts = {"q_proj": cfg.num_heads * d, "k_proj": cfg.num_kv_heads * d, "v_proj": cfg.num_kv_heads * d}
        self.qkv_proj = nn.Linear(h, sum(parts.values()), bias=cfg.qkv_bias)
        hf_names_for_stacked(self, "qkv_proj", parts)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        if cfg.qk_norm:  # Qwen3 normalises each head's q and k before RoPE
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x, cos, sin, layer: int, attend: Attend) -> torch.Tensor:
        """Attention with its output projection: `[B, T, hidden]`."""
        heads = self.attend_heads(x, cos, sin, layer, attend)
        with label("sfibench.projections"):
            return fused.ops["linear"](heads, self.o_proj.weight)

    def attend_heads(self, x, cos, sin, layer: int, attend: Attend, folded_norm=None) -> torch.Tensor:
        """Attention before the output projection: the heads side by side, `[B, T, H_q * D]`.
        `folded_norm` = (input_squares, eps): x is the raw residual stream and the input norm rides on the
        qkv product (Decoder.fold_input_norms; decode only)."""
        batch, seq, _ = x.shape
        norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else (None, None, 0.0)
        append_target = getattr(attend, "append_target", None)
        if folded_norm is not None:
            squares, eps = folded_norm
            with label("sfibench.projections"):
                q = fused.ops["linear_qk_norm_rope_append"](
                    x, self.qkv_proj.weight, self.qkv_proj.bias, *norms, cos, sin, self.num_heads, self.num_kv_heads,
                    *append_target(layer), input_squares=squares, input_eps=eps)
            out = attend(layer, q, None, None)
        elif seq == 1 and append_target is not None:
            # Decode: the engine names where this layer's new k/v go; the qkv product, whose kernel also
            # normalises, rotates and appends them (qkv_epilogue.py; or a second kernel), gives q, and
            # attend gets no k/v to store.
            with label("sfibench.projections"):  # a label for `sfibench profile`
                q = fused.ops["linear_qk_norm_rope_append"](x, self.qkv_proj.weight, self.qkv_proj.bias, *norms, cos,
                                                            sin, self.num_heads, self.num_kv_heads,
                                                            *append_target(layer))
            out = attend(layer, q, None, None)
        else:
            with label("sfibench.projections"):
                qkv = fused.ops["linear"](x, self.qkv_proj.weight, self.qkv_proj.bias)
            q, k = fused.ops["qk_norm_rope"](qkv, *norms, cos, sin, self.num_heads, self.num_kv_heads)
            v = qkv.view(batch, seq, -1, self.head_dim)[:, :, self.num_heads + self.num_kv_heads:]
            out = attend(layer, q, k, v.transpose(1, 2))  # [B, H_q, T, D]
        return out.transpose(1, 2).reshape(batch, seq, -1)


class MLP(nn.Module):
    """A gated MLP; `activation` names the fused op applied to the stacked gate/up projection
    (`silu_mul`: SwiGLU, `gelu_tanh_mul`: Gemma's GeGLU)."""

    def __init__(self, cfg: ModelConfig, activation: str = "silu_mul"):
        super().__init__()
        self.activation = activation
        parts = {"gate_proj": cfg.intermediate_size, "up_proj": cfg.intermediate_size}
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        hf_names_for_stacked(self, "gate_up_proj", parts)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with label("sfibench.mlp"):  # a label for `sfibench profile`
            return fused.ops["linear"](self.activated(x), self.down_proj.weight)

    def activated(self, x: torch.Tensor) -> torch.Tensor:
        """The gated activation of the stacked gate/up projection: down_proj's input (unlabelled: the
        caller's `sfibench.mlp` label covers it, and nested labels of one name would count twice)."""
        return fused.ops["gate_up_activation"](x, self.gate_up_proj.weight, self.activation)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, residual, normed, cos, sin, layer: int, attend: Attend, next_norm: RMSNorm):
        """`residual` is the residual stream entering this layer and `normed` its input norm. Returns the
        stream after this layer and its norm by `next_norm` (the next layer's input norm, or the final
        one). After o_proj the residual add and the norm ride on the product (on a GPU one launch for all
        three, gemv.linear_add_rms_norm); after down_proj they are one kernel of their own."""
        heads = self.self_attn.attend_heads(normed, cos, sin, layer, attend)
        norm = self.post_attention_layernorm
        with label("sfibench.projections"):  # o_proj, the residual add and the post-attention norm
            residual, normed = fused.ops["linear_add_rms_norm"](heads, self.self_attn.o_proj.weight, residual,
                                                                norm.weight, norm.eps)
        with label("sfibench.mlp"):  # down_proj, then the residual add and the next norm as one compiled kernel
            # Not gemv's epilogue as after o_proj: measured on an H200 (4B, 32K) that made the fast step
            # 0.02 ms slower at B = 1 and 0.14 ms at B = 5 (the last program's serial norm of whole rows).
            mlp_out = fused.ops["linear"](self.mlp.activated(normed), self.mlp.down_proj.weight)
            return fused.ops["add_rms_norm"](mlp_out, residual, next_norm.weight, next_norm.eps)

    def forward_folded(self, residual, squares, cos, sin, layer: int, attend: Attend, output_gain=None):
        """A decode step with the input norm folded into the qkv product (Decoder.fold_input_norms):
        `squares` holds partial sums of squares of `residual`'s rows, from which the qkv kernel scales its
        product; down_proj adds the residual and writes the next layer's partials. No norm kernel of its
        own: with the qkv epilogue a layer is 4 launches plus attention. The post-attention norm is folded
        too: o_proj writes partials the same way and gate_up scales by them (no program of o_proj waits
        for the others to normalise whole rows). Returns (the stream after this layer, its partials); with
        `output_gain` (the last layer, the final norm's weight) the stream times that gain."""
        heads = self.self_attn.attend_heads(residual, cos, sin, layer, attend,
                                            folded_norm=(squares, self.input_layernorm.eps))
        norm, mlp = self.post_attention_layernorm, self.mlp
        with label("sfibench.projections"):  # o_proj writes the stream and its partials for gate_up's norm
            residual, squares = fused.ops["linear_add_squares"](heads, self.self_attn.o_proj.weight, residual)
        with label("sfibench.mlp"):
            activated = fused.ops["gate_up_activation"](residual, mlp.gate_up_proj.weight, mlp.activation,
                                                        input_squares=squares, input_eps=norm.eps)
            return fused.ops["linear_add_squares"](activated, mlp.down_proj.weight, residual,
                                                   output_gain=output_gain)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_class: type[nn.Module]):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer_class(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Decoder(nn.Module):
    layer_class: type[nn.Module] = DecoderLayer

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg, self.layer_class)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.init_buffers()

    def init_buffers(self, device=None) -> None:
        """(Re)compute the derived, non-persistent buffers on `device`: after `to_empty` (which leaves
        them uninitialised) and after a dtype cast (the RoPE frequencies stay float32: bf16 would blur
        positions)."""
        cfg = self.config
        self.position_tables = PositionTable()  # rebuilt with the frequencies they come from
        inv_freq, self.rope_amplitude = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_dict())
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the checkpoint does (`to_empty` unties them)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def can_fold_input_norms(self) -> bool:
        """Whether fold_input_norms applies: Llama-family layers (Gemma-3's norm sits elsewhere)."""
        return self.layer_class is DecoderLayer

    def fold_pays(self, device) -> bool:
        """Whether folding the norms saves launches on `device`: the sums of squares the folds need come
        from down_proj's and o_proj's Triton epilogues. Where those products run on cuBLAS instead
        (gemv.decode_config gives them no tile) the sums would cost launches of their own, more than the
        norm kernel they replace: on an H200, qwen3-0.6b's fast step folded that way spent 0.34 ms outside
        weights and attention against 0.179 unfolded."""
        from sfibench.optimized import gemv

        cfg, device = self.config, torch.device(device)
        return self.can_fold_input_norms and all(
            gemv.decode_config(1, cfg.hidden_size, n_in, device) is not None
            for n_in in (cfg.intermediate_size, cfg.num_heads * cfg.head_dim))

    @torch.no_grad()
    def fold_input_norms(self) -> None:
        """Decode without a norm kernel per layer (GPU sessions where `fold_pays`).

        A layer's input norm feeds only its qkv product, and W (g * x / rms(x)) = (W diag(g)) x / rms(x):
        the norm's weight moves into the qkv weight, in place (one rounding per weight, in the model dtype),
        and the norm keeps only its 1 / rms (its weight becomes ones), so no second copy of any weight
        exists and every path, prefill and unfolded decode included, computes the same function. At decode
        the 1 / rms, one number per row, scales the product's output; the sum of squares it needs comes
        from the kernel before (down_proj's epilogue, each program its columns' share), so the qkv GEMV's
        main loop is unchanged. Rounding differs from the unfolded decoder by that one rounding per weight
        and the norm computed in float32 without the intermediate casts.

        The post-attention norm likewise, into gate_up, the sums of squares from o_proj's epilogue: o_proj's
        add + norm epilogue had its last program normalise whole rows while the others waited. The final
        norm is folded too, without touching the LM head (which may be the tied embedding): the last
        down_proj writes the stream times the norm's weight (linear_add_squares' `output_gain`).
        The state dict afterwards holds the folded weights and unit norms: the same model, written
        differently. Folding twice would scale by the gains twice, so a second call is refused.
        """
        if not self.can_fold_input_norms:
            raise ValueError(f"{type(self).__name__} has its own layer structure: the input-norm fold is "
                             f"written for the Llama-family DecoderLayer only")
        if getattr(self, "folded_input_norms", False):
            raise ValueError("the norms are already folded into the weights")
        for layer in self.model.layers:
            for weight, norm in ((layer.self_attn.qkv_proj.weight, layer.input_layernorm),
                                 (layer.mlp.gate_up_proj.weight, layer.post_attention_layernorm)):
                weight.mul_(norm.weight)  # [out, in] * [in]: no temporary
                norm.weight.fill_(1.0)
        self.folded_input_norms = True
        self.folded_post_attention_norms = True

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend,
                last_only: bool = False) -> torch.Tensor:
        """tokens and positions `[B, T]` -> logits `[B, T, V]` (or `[B, 1, V]` with last_only)."""
        layers = self.model.layers
        if getattr(self, "folded_input_norms", False) and tokens.shape[1] == 1 \
                and getattr(attend, "append_target", None) is not None:
            # squares: the partial sums of squares the first layer's folded input norm scales by
            residual, squares, cos, sin = self.decode_inputs(tokens, positions)
            final = self.model.norm
            for index, layer in enumerate(layers):
                gain = final.weight if index == len(layers) - 1 else None
                residual, squares = layer.forward_folded(residual, squares, cos, sin, index, attend, gain)
            # The final norm is folded too, with its weight applied by the last down_proj: the LM head gets
            # g * x and x's sums of squares, and scales its product by 1 / rms(x).
            return self.head(residual, input_squares=squares, input_eps=final.eps)
        x = self.embed(tokens)
        tables = self.rope_tables(positions, x.dtype)
        residual, normed = x, layers[0].input_layernorm(x)
        for index, layer in enumerate(layers):
            next_norm = layers[index + 1].input_layernorm if index + 1 < len(layers) else self.model.norm
            residual, normed = layer(residual, normed, *tables[index], index, attend, next_norm)
        return self.head(normed[:, -1:] if last_only else normed)

    def decode_inputs(self, tokens: torch.Tensor, positions: torch.Tensor):
        """A folded decode step's inputs (fused.decode_inputs): embeddings, their sums of squares, and the
        cos/sin every layer shares, gathered from the position table (which holds rope_cos_sin's values). The
        folded decoder is the Llama family's (can_fold_input_norms): one embedding and one RoPE table for all
        layers. Fused, one launch where the embedding, the three ops of the squares and the gather were
        five."""
        weight = self.model.embed_tokens.weight
        table = self.position_tables.table(self.inv_freq, self.rope_amplitude, weight.dtype,
                                           self.config.max_context)
        return fused.ops["decode_inputs"](tokens, positions, weight, table)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the (cos, sin) it rotates q and k by: one table shared by every layer here."""
        table = self.rope_cos_sin(self.inv_freq, self.rope_amplitude, positions, dtype)
        return [table] * self.config.num_layers

    def rope_cos_sin(self, inv_freq: torch.Tensor, amplitude: float, positions: torch.Tensor, dtype: torch.dtype):
        """rope.rope_cos_sin; on a GPU gathered from a table of every position (one launch, not eight)."""
        if positions.device.type == "cuda":
            return self.position_tables(inv_freq, amplitude, positions, dtype, self.config.max_context)
        return rope_cos_sin(inv_freq, amplitude, positions, dtype)

    def head(self, normed: torch.Tensor, **folded_norm) -> torch.Tensor:
        """Final-normed hidden states -> float32 logits (the product in the model's dtype, stored as float32
        by the product itself). `folded_norm`: input_squares and input_eps of a folded final norm."""
        return fused.ops["linear"](normed, self.lm_head.weight, out_dtype=torch.float32, **folded_norm)
