"""StreamingLLM: attention sinks plus a sliding window of the most recent tokens.

Evicts everything else for good, so it can never look back at a needle that slid out of the window.
Keys keep the RoPE of their original positions (no re-rotation into the cache), which reports state.
The budget is the tokens read per (layer, KV head): sinks + window, matched to SFI's.
"""

from __future__ import annotations

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.methods import AttentionMethod, register
from sfibench.reference.sparse_memory import attend_fixed_plus_tail


@register("streaming_llm", "reference")
class StreamingLLM(AttentionMethod):
    name = "streaming_llm"

    def __init__(self, spec, model_config, tokenizer):
        super().__init__(spec, model_config, tokenizer)
        cfg = spec.streaming
        if cfg.budget <= cfg.n_sink:
            raise ValueError(f"StreamingLLM budget ({cfg.budget}) must exceed its {cfg.n_sink} sink tokens")
        self.cfg = cfg

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan) -> torch.Tensor:
        # Every size comes from the configuration, so the default plan (no static sizes) serves every step.
        batch, kv_heads = cache.batch, cache.k.shape[2]
        sinks = torch.arange(self.cfg.n_sink, device=q.device).expand(batch, kv_heads, -1)
        sinks_valid = sinks < ctx.kv_lengths[:, None, None]
        window_start = (ctx.kv_lengths - (self.cfg.budget - self.cfg.n_sink)).clamp(min=self.cfg.n_sink)
        out, read = attend_fixed_plus_tail(q, cache.k[ctx.layer], cache.v[ctx.layer], sinks, sinks_valid,
                                           window_start, ctx.kv_lengths, self.cfg.budget - self.cfg.n_sink)
        ctx.tokens_read[ctx.layer] = read
        return out
