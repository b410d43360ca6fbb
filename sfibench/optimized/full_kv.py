"""Full-KV, optimized path: dense decode attention with the split-K Triton kernel.

The kernel reads each sequence's length from a device tensor, so one CUDA graph serves every step
as the context grows and no masked tail is read (the reference path's SDPA needs a static, masked
capacity instead). `sfibench throughput` checks it against PyTorch's SDPA backends at the same shape.
"""

from __future__ import annotations

import os

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.prefill import Prefilled
from sfibench.methods import AttentionMethod, register
from sfibench.optimized.decode_attention import dense_decode


def require_triton_device(device: torch.device) -> None:
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the optimized path runs Triton kernels and needs a CUDA device; use --path reference "
                         "on this machine (tests run the kernels on the CPU with TRITON_INTERPRET=1)")


@register("full_kv", "optimized")
class TritonFullKV(AttentionMethod):
    name = "full_kv"
    step_kind = "dense"

    def start(self, cache: KVCache, prefilled: Prefilled) -> None:
        require_triton_device(cache.k.device)

    def begin_step(self, ctx: StepContext, plan) -> None:
        # Every layer reads every token: counted once per step, not by a launch beside each layer's attention
        # (36 more kernels a step on qwen3-4b, which only the baseline would pay).
        ctx.tokens_read.copy_(ctx.kv_lengths[None, :, None].expand_as(ctx.tokens_read))

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan) -> torch.Tensor:
        # Lengths are read on the device: the default plan (nothing host-side) serves every step. The kernel
        # just before this one (the step's k/v append) does not write them: they may be read before a PDL wait.
        out = dense_decode(q[:, :, 0], cache.k[ctx.layer], cache.v[ctx.layer], ctx.kv_lengths,
                           index_before_wait=True)
        return out[:, :, None]
