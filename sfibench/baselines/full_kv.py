"""Full-KV: every decode step attends densely to the whole history (the baseline SFI must beat)."""

from __future__ import annotations

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.methods import AttentionMethod, register
from sfibench.reference.attention import dense_attention


@register("full_kv", "reference")
class FullKV(AttentionMethod):
    name = "full_kv"
    step_kind = "dense"

    def plan_step(self, ctx: StepContext) -> None:
        longest = int(ctx.kv_lengths_host.max())
        self.capacity = ctx.bucketed(longest)
        self.masked = bool((ctx.kv_lengths_host != self.capacity).any())

    def graph_key(self, ctx: StepContext) -> tuple:
        return (self.capacity, self.masked)

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext) -> torch.Tensor:
        ctx.tokens_read[ctx.layer] = ctx.kv_lengths[:, None]
        return dense_attention(q, cache.k[ctx.layer], cache.v[ctx.layer], ctx.kv_lengths, self.capacity,
                               self.masked)
