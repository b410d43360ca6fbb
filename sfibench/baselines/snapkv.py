"""SnapKV: one-shot prompt compression chosen by the prompt's last queries, never revisited.

After prefill, the last `window` prompt queries vote for earlier prompt positions (attention mass,
averaged over the window rows and the GQA group), the votes are smoothed by 1-D pooling so that
neighbours of a strong position survive together, and the top positions per KV head are kept along
with the window itself. Decoding reads the kept prompt tokens plus everything generated since.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.prefill import Prefilled
from sfibench.methods import AttentionMethod, register
from sfibench.reference.sparse_memory import TailPlan, attend_fixed_plus_tail

POOLINGS = ("max", "avg")


@register("snapkv", "reference")
class SnapKV(AttentionMethod):
    name = "snapkv"

    def __init__(self, spec, model_config, tokenizer):
        super().__init__(spec, model_config, tokenizer)
        cfg = spec.snapkv
        if cfg.pooling not in POOLINGS:
            raise ValueError(f"unknown SnapKV pooling {cfg.pooling!r}; valid: {', '.join(POOLINGS)}")
        if cfg.budget <= cfg.window:
            raise ValueError(f"SnapKV budget ({cfg.budget}) must exceed its observation window ({cfg.window})")
        if cfg.kernel % 2 == 0:
            raise ValueError(f"SnapKV pooling kernel must be odd, got {cfg.kernel}")
        self.cfg = cfg

    def start(self, cache: KVCache, prefilled: Prefilled) -> None:
        mc, keep = self.model_config, self.cfg.budget - self.cfg.window
        device = cache.k.device
        self.state("kept", (mc.num_layers, cache.batch, mc.num_kv_heads, keep), torch.long, device)
        self.state("kept_count", (cache.batch,), torch.long, device)
        self.state("tail_start", (cache.batch,), torch.long, device).copy_(prefilled.lengths)  # read from here on
        for row in range(cache.batch):
            length = int(prefilled.lengths[row])
            if length <= self.cfg.budget:  # the whole prompt fits: keep it all
                self.tail_start[row] = 0
                continue
            if int(prefilled.query_counts[row]) < self.cfg.window:
                raise ValueError(f"SnapKV needs the last {self.cfg.window} prompt queries; the engine kept "
                                 f"{int(prefilled.query_counts[row])} (raise the engine's evidence_rows)")
            prefix = length - self.cfg.window
            self.tail_start[row] = prefix
            self.kept_count[row] = keep
            for layer in range(mc.num_layers):
                votes = self._votes(cache, prefilled, layer, row, prefix)
                top = votes.topk(keep, dim=-1).indices  # [H_kv, keep]
                self.kept[layer, row] = top.sort(dim=-1).values
        self.tail_start_host = self.tail_start.cpu()

    def _votes(self, cache, prefilled, layer: int, row: int, prefix: int) -> torch.Tensor:
        """Pooled attention mass of the window queries on each prefix position, per KV head."""
        mc, window = self.model_config, self.cfg.window
        count = int(prefilled.query_counts[row])
        q = prefilled.queries[layer, row, :, count - window:count].float()  # [H_q, W, D]
        length = prefix + window
        keys = cache.k[layer, row, :, :length].float().repeat_interleave(mc.group_size, dim=0)
        logits = torch.einsum("hwd,hnd->hwn", q, keys) * mc.head_dim ** -0.5
        causal = torch.arange(length, device=q.device)[None, :] <= torch.arange(prefix, length, device=q.device)[:, None]
        weights = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)[..., :prefix]
        votes = weights.mean(dim=1).view(mc.num_kv_heads, mc.group_size, prefix).mean(dim=1)
        pool = F.max_pool1d if self.cfg.pooling == "max" else F.avg_pool1d
        return pool(votes[:, None], self.cfg.kernel, stride=1, padding=self.cfg.kernel // 2)[:, 0]

    def plan(self, ctx: StepContext) -> TailPlan:
        return TailPlan(tail_width=ctx.bucketed(int((ctx.kv_lengths_host - self.tail_start_host).max())))

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan: TailPlan) -> torch.Tensor:
        kept = self.kept[ctx.layer]
        valid = torch.arange(kept.shape[-1], device=q.device) < self.kept_count[:, None, None]
        out, read = attend_fixed_plus_tail(q, cache.k[ctx.layer], cache.v[ctx.layer], kept,
                                           valid.expand_as(kept), self.tail_start, ctx.kv_lengths,
                                           plan.tail_width)
        ctx.tokens_read[ctx.layer] = read
        return out
