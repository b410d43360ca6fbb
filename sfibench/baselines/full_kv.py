"""Full-KV: every decode step attends densely to the whole history (the baseline SFI must beat)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.methods import AttentionMethod, StepPlan, register
from sfibench.reference.attention import dense_attention


@dataclass(frozen=True)
class DensePlan(StepPlan):
    capacity: int = 0  # slots read per sequence (the longest length, bucketed)
    masked: bool = False  # some sequence is shorter than the capacity


@register("full_kv", "reference")
class FullKV(AttentionMethod):
    name = "full_kv"
    step_kind = "dense"

    def plan(self, ctx: StepContext) -> DensePlan:
        capacity = ctx.bucketed(int(ctx.kv_lengths_host.max()))
        return DensePlan(capacity=capacity, masked=bool((ctx.kv_lengths_host != capacity).any()))

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan: DensePlan) -> torch.Tensor:
        ctx.tokens_read[ctx.layer] = ctx.kv_lengths[:, None]
        return dense_attention(q, cache.k[ctx.layer], cache.v[ctx.layer], ctx.kv_lengths, plan.capacity,
                               plan.masked)
