"""One rank's share of a Llama-family decoder under tensor parallelism (Megatron-style).

Per layer, qkv and gate_up are split by output rows (column-parallel: each rank computes its own heads and
its own MLP rows, no communication) and o_proj and down_proj by input columns (row-parallel: each rank's
product is a partial sum, one all-reduce each). A rank holds whole KV heads and the query heads that read
them, so its decoder is an ordinary decoder of `num_heads / N` query and `num_kv_heads / N` KV heads: the
engine sizes the KV cache from that config, and every method's state, being per KV head, is per rank
without knowing it. The LM head is split by vocabulary rows and its logits gathered, so every rank samples
from the whole vocabulary. Embeddings and norms are replicated (small, and read by every rank).

Gemma-3's layers (models/gemma3.py) and the folded norms (Decoder.fold_input_norms) are not sharded.
"""

from __future__ import annotations


import torch

from sfibench.core.labels import label
from sfibench.core.parallel import TensorParallel, check_divisible, shard_bounds
from sfibench.core.errors import UsageError
from sfibench.models import fused
from sfibench.models.decoder import Decoder, DecoderLayer
from sfibench.models.presets import ModelConfig


class ShardedDecoderLayer(DecoderLayer):
    """DecoderLayer with the all-reduce of o_proj's and down_proj's partial sums before each residual add."""
    parallel: TensorParallel

    def forward(self, residual, normed, cos, sin, layer: int, attend, next_norm):
        heads = self.self_attn.attend_heads(normed, cos, sin, layer, attend)
        norm = self.post_attention_layernorm
        with label("sfibench.projections"):
            attended = self.parallel.all_reduce(fused.ops["linear"](heads, self.self_attn.o_proj.weight))
            residual, normed = fused.ops["add_rms_norm"](attended, residual, norm.weight, norm.eps)
        with label("sfibench.mlp"):
            mlp_out = self.parallel.all_reduce(fused.ops["linear"](self.mlp.activated(normed),
                                                                  self.mlp.down_proj.weight))
            return fused.ops["add_rms_norm"](mlp_out, residual, next_norm.weight, next_norm.eps)


class ShardedDecoder(Decoder):
    """A rank's decoder: its heads and MLP rows (config `local`), its vocabulary rows of the LM head."""
    layer_class = ShardedDecoderLayer

    def __init__(self, local: ModelConfig, parallel: TensorParallel):
        self.parallel = parallel
        self.vocab_rows = shard_bounds(local.vocab_size, parallel.rank, parallel.world_size)
        super().__init__(local)
        for layer in self.model.layers:
            layer.parallel = parallel

    def tie_weights(self) -> None:
        start, stop = self.vocab_rows
        self.lm_head = torch.nn.Linear(self.config.hidden_size, stop - start, bias=False,
                                       device=self.model.embed_tokens.weight.device,
                                       dtype=self.model.embed_tokens.weight.dtype)
        if self.config.tie_word_embeddings:  # a view of the embedding's rows: no second copy
            self.lm_head.weight = torch.nn.Parameter(self.model.embed_tokens.weight[start:stop])

    def head(self, normed: torch.Tensor, **folded_norm) -> torch.Tensor:
        return self.parallel.gather_last(super().head(normed, **folded_norm), self.config.vocab_size)


def check_shardable(config: ModelConfig, world_size: int) -> None:
    """Whether `config` splits over `world_size` ranks: raised before any weight loads."""
    if config.arch == "gemma3":
        raise UsageError(f"--tp {world_size}: {config.name} is a Gemma-3 model, which runs on one device only; "
                         "tensor parallelism covers the Llama, Qwen2 and Qwen3 families")
    check_divisible(config.name, config.num_kv_heads, config.num_heads, config.intermediate_size, world_size)


@torch.no_grad()
def shard(full: Decoder, parallel: TensorParallel, device) -> ShardedDecoder:
    """This rank's ShardedDecoder on `device`, its weights copied out of the whole model `full` (same dtype)."""
    config = full.config
    check_shardable(config, parallel.world_size)
    dtype = full.model.embed_tokens.weight.dtype
    with torch.device("meta"):  # built empty, so the rank allocates its share once, in the model's dtype
        model = ShardedDecoder(config.rank_share(parallel.world_size), parallel).to(dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    source = full.state_dict()
    for name, target in model.state_dict(keep_vars=True).items():  # stacked q/k/v, gate/up: views by HF name
        target.copy_(_rank_slice(name, source[name], config, parallel))
    model.init_buffers(torch.device(device))
    return model.eval()


def _rank_slice(name: str, whole: torch.Tensor, config: ModelConfig, parallel: TensorParallel) -> torch.Tensor:
    """This rank's part of the checkpoint tensor `name` (Hugging Face names: q/k/v and gate/up separate)."""
    rank, world = parallel.rank, parallel.world_size
    d = config.head_dim

    def rows(count: int, dim: int = 0) -> torch.Tensor:
        start, stop = shard_bounds(count, rank, world)
        return whole.narrow(dim, start, stop - start)

    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return rows(config.num_heads * d)
    if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
        return rows(config.num_kv_heads * d)
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        return rows(config.intermediate_size)
    if name.endswith("o_proj.weight"):
        return rows(config.num_heads * d, dim=1)
    if name.endswith("down_proj.weight"):
        return rows(config.intermediate_size, dim=1)
    if name == "lm_head.weight":
        return rows(config.vocab_size)
    return whole  # embeddings and norms: replicated
