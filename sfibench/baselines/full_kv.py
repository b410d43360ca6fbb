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

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext) -> torch.Tensor:
        ctx.tokens_read[ctx.layer] = ctx.kv_lengths[:, None]
        return dense_attention(q, cache.k[ctx.layer], cache.v[ctx.layer], ctx.kv_lengths)
