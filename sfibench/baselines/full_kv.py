"""Full-KV: every decode step attends densely to the whole history (the baseline SFI must beat).

The reference path is SDPA over a static, masked capacity (the longest length, bucketed). The optimized
path is the split-K Triton kernel, which reads each sequence's length from a device tensor, so one CUDA
graph serves every step as the context grows and no masked tail is read; `sfibench throughput` checks
it against PyTorch's SDPA backends at the same shape (SPEC 6: a weak dense baseline is a defect).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sfibench.engine.method import AttentionMethod, MethodConfig, MethodDef, StepPlan
from sfibench.optimized.decode_attention import dense_decode
from sfibench.optimized.triton_device import require_triton_device
from sfibench.reference.attention import dense_attention


@dataclass(frozen=True)
class FullKVConfig(MethodConfig):
    """Nothing to set: Full-KV reads every cached token (MethodConfig's defaults are a dense method's)."""


@dataclass(frozen=True)
class DensePlan(StepPlan):
    capacity: int = 0  # slots read per sequence (the longest length, bucketed)
    masked: bool = False  # some sequence is shorter than the capacity


class FullKV(AttentionMethod):
    name = "full_kv"
    step_kind = "dense"

    def plan(self, ctx) -> DensePlan:
        capacity = ctx.bucketed(int(ctx.kv_lengths_host.max()))
        return DensePlan(capacity=capacity, masked=bool((ctx.kv_lengths_host != capacity).any()))

    def attend(self, q: torch.Tensor, cache, ctx, plan: DensePlan) -> torch.Tensor:
        ctx.tokens_read[ctx.layer] = ctx.kv_lengths[:, None]
        return dense_attention(q, cache.k[ctx.layer], cache.v[ctx.layer], ctx.kv_lengths, plan.capacity,
                               plan.masked)


class TritonFullKV(AttentionMethod):
    name = "full_kv"
    step_kind = "dense"

    def start(self, cache, prefilled) -> None:
        require_triton_device(cache.k.device)

    def begin_step(self, ctx, plan) -> None:
        # Every layer reads every token: counted once per step, not by a launch beside each layer's attention
        # (36 more kernels a step on qwen3-4b, which only the baseline would pay).
        ctx.tokens_read.copy_(ctx.kv_lengths[None, :, None].expand_as(ctx.tokens_read))

    def attend(self, q: torch.Tensor, cache, ctx, plan) -> torch.Tensor:
        # Lengths are read on the device: the default plan (nothing host-side) serves every step. The kernel
        # just before this one (the step's k/v append) does not write them: they may be read before a PDL wait.
        out = dense_decode(q[:, :, 0], cache.k[ctx.layer], cache.v[ctx.layer], ctx.kv_lengths,
                           index_before_wait=True)
        return out[:, :, None]


METHOD = MethodDef(name="full_kv", summary="dense attention over the whole history at every step",
                   config=FullKVConfig, paths={"reference": FullKV, "optimized": TritonFullKV}, dense=True)
