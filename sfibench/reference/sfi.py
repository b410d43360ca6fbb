"""Slow-Fast Inference, reference path: plain PyTorch, exact, and the oracle for the optimized path.

Per (layer, sequence, KV head) the sparse memory is sinks + the Selector's picks + a recent window
(SPEC 2; geometry in sfi/geometry.py). A fast row gathers exactly those positions and attends to them.
A slow row attends densely with SDPA (its output is exact); both are computed in the same step and
each row takes its own, so a batch mixing slow and fast rows is one (graphable) step. The step keeps
each layer's query; after the step the Selector recomputes the slow rows' logits over the candidates
from those queries and the cache (a second pass over K, which the optimized path avoids), and the new
picks are used from the next step. Triggers, layer groups, the bootstrap from the last w_prefill
prompt queries and the selection state are shared with the optimized path (sfi/method.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.method import StepPlan
from sfibench.reference.attention import dense_attention
from sfibench.reference.sparse_memory import attend_fixed_plus_tail
from sfibench.sfi.method import SFIMethod, candidate_logits


@dataclass(frozen=True)
class ReferenceSFIPlan(StepPlan):
    tail_width: int = 1  # static bound on the fast rows' recent window
    dense_capacity: int = 0  # > 0: some row reads densely this step, over this many slots
    dense_masked: bool = False  # the dense rows' lengths differ from the capacity
    keep_queries: bool = False  # some row refreshes after this step: keep each layer's query


class ReferenceSFI(SFIMethod):
    def __init__(self, config, model_config, tokenizer):
        super().__init__(config, model_config, tokenizer)
        if self.cfg.publish != "next_step":
            raise ValueError("the reference path publishes every refresh for the next step; "
                             "--publish when_ready needs --path optimized")

    def start(self, cache: KVCache, prefilled) -> None:
        mc = self.model_config
        self.state("queries", (mc.num_layers, cache.batch, mc.num_heads, mc.head_dim), cache.k.dtype, cache.k.device)
        super().start(cache, prefilled)

    def path_plan(self, ctx: StepContext) -> ReferenceSFIPlan:
        # [L, B]; the host knows what is published. Sliding layers (never published) attend in the engine.
        dense = (self.dense_host | (self.sel.published_host < 0)) & self.global_rows
        lengths = ctx.kv_lengths_host[None, :]
        window = torch.where(dense | ~self.global_rows, 0, lengths - self.sel.tail_start_host)
        dense_lengths = ctx.kv_lengths_host[dense.any(dim=0)]
        capacity = ctx.bucketed(int(dense_lengths.max())) if len(dense_lengths) else 0
        return ReferenceSFIPlan(tail_width=ctx.bucketed(max(int(window.max()), 1)), dense_capacity=capacity,
                                dense_masked=bool((dense_lengths != capacity).any()),
                                keep_queries=bool(self.refresh_host.any()))

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan: ReferenceSFIPlan) -> torch.Tensor:
        layer, cfg, sel = ctx.layer, self.cfg, self.sel
        k, v = cache.k[layer], cache.v[layer]
        batch, heads = k.shape[:2]
        live = sel.live[layer]
        dense = self.dense_rows[layer] | (live < 0)  # [B]
        buffer, rows = live.clamp(min=0), torch.arange(batch, device=q.device)
        sinks, count = sel.sinks[buffer, layer, rows], sel.counts[buffer, layer, rows]  # [B], [B, H_kv]
        # Fast rows: sinks + selected (the fixed part) and the recent tail [max(anchor, sinks), L).
        sink_slots = torch.arange(cfg.n_sink, device=q.device).expand(batch, heads, -1)
        sinks_valid = (sink_slots < sinks[:, None, None]) & ~dense[:, None, None]
        picks_valid = (torch.arange(cfg.k_head, device=q.device) < count[..., None]) & ~dense[:, None, None]
        fixed = torch.cat([sink_slots, sel.positions[buffer, layer, rows]], dim=-1)
        fixed_valid = torch.cat([sinks_valid, picks_valid], dim=-1)
        tail_start = torch.where(dense, ctx.kv_lengths, torch.maximum(sel.anchor[buffer, layer, rows], sinks))
        out, read = attend_fixed_plus_tail(q, k, v, fixed, fixed_valid, tail_start, ctx.kv_lengths, plan.tail_width)
        if plan.dense_capacity:  # slow (or bridge) rows: exact dense attention
            exact = dense_attention(q, k, v, ctx.kv_lengths, plan.dense_capacity, plan.dense_masked)
            out = torch.where(dense[:, None, None, None], exact, out)
            read = torch.where(dense[:, None], ctx.kv_lengths[:, None], read)
        if plan.keep_queries:
            self.queries[layer].copy_(q[:, :, 0])
        ctx.tokens_read[layer] = read
        return out

    def decode_evidence(self, row: int, layers: list[int], lo: int, hi: int) -> torch.Tensor:
        group = self.model_config.group_size
        out = []
        for layer in layers:  # one layer at a time: K over the candidates is read (again) here
            q = self.queries[layer, row].view(-1, group, 1, self.queries.shape[-1])  # [H_kv, G, W=1, D]
            out.append(candidate_logits(q, self.cache.k[layer, row, :, lo:hi]).flatten(1, 2))
        return torch.stack(out)
