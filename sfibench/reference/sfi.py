"""Slow-Fast Inference, reference path: plain PyTorch, exact, and the oracle for the optimized path.

Per (layer, sequence, KV head) the sparse memory is sinks + the Selector's picks + a recent window
(SPEC 2). A fast step attends only to that memory. A slow step attends densely (its output is exact)
and, in the same layer pass, hands the dense logits over the candidate range to the Selector, whose
new picks take effect from the next step. Prefill is the first (bootstrap) refresh, with the last
`w_prefill` prompt queries as evidence.
"""

from __future__ import annotations

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.prefill import Prefilled
from sfibench.methods import AttentionMethod, register
from sfibench.metrics.labels import label
from sfibench.reference.attention import dense_attention
from sfibench.reference.selector import select
from sfibench.reference.sparse_memory import attend_fixed_plus_tail, recent_start
from sfibench.reference.triggers import SlowStepScheduler, token_byte_table, token_classes


@register("sfi", "reference")
class ReferenceSFI(AttentionMethod):
    name = "sfi"
    has_slow_steps = True

    def __init__(self, spec, model_config, tokenizer):
        super().__init__(spec, model_config, tokenizer)
        self.cfg = spec.sfi
        if self.cfg.layer_groups not in (1, 2):
            raise ValueError(f"layer_groups must be 1 or 2, got {self.cfg.layer_groups}")
        self.token_bytes = token_byte_table(tokenizer.backend, model_config.vocab_size)
        self.is_ender, self.is_blank = token_classes(tokenizer.backend, model_config.vocab_size, self.token_bytes)

    def start(self, cache: KVCache, prefilled: Prefilled) -> None:
        cfg, mc = self.cfg, self.model_config
        layers, batch, device = mc.num_layers, cache.batch, cache.k.device
        self.state("selected", (layers, batch, mc.num_kv_heads, cfg.k_head), torch.long, device)
        self.state("selected_count", (layers, batch), torch.long, device)
        self.state("anchor", (layers, batch), torch.long, device)  # recent window start
        self.anchor_host = torch.zeros(layers, batch, dtype=torch.long)  # mirror, to size tensors without a sync
        self.slow_steps_taken = torch.zeros(batch, dtype=torch.long)  # picks the layer group to refresh
        self.scheduler = SlowStepScheduler(cfg.trigger, self.is_ender, self.is_blank, batch, self.token_bytes)
        self._bootstrap(cache, prefilled)

    def _bootstrap(self, cache: KVCache, prefilled: Prefilled) -> None:
        """Prefill is slow step 0: evidence = the last w_prefill prompt queries, causally masked."""
        group = self.model_config.group_size
        for row in range(cache.batch):
            length = int(prefilled.lengths[row])
            rows = min(self.cfg.w_prefill, int(prefilled.query_counts[row]))
            first = int(prefilled.query_counts[row]) - rows
            query_pos = prefilled.query_positions(row)[first:].to(cache.k.device)
            for layer in range(self.model_config.num_layers):
                q = prefilled.queries[layer, row, :, first:first + rows]  # [H_q, W, D]
                self._refresh(cache, layer, row, length, q.reshape(-1, group, rows, q.shape[-1]), query_pos)

    def _refresh(self, cache: KVCache, layer: int, row: int, length: int, q: torch.Tensor,
                 query_pos: torch.Tensor) -> None:
        """New picks for one (layer, sequence) from queries `q [H_kv, G, W, D]` at `query_pos [W]`."""
        cfg = self.cfg
        lo = min(cfg.n_sink, length)
        hi = int(recent_start(torch.tensor(length), cfg.n_recent, cfg.page))
        self.anchor[layer, row] = hi
        self.anchor_host[layer, row] = hi
        if hi <= lo:  # no candidates yet: sinks + recent already cover the whole history
            self.selected_count[layer, row] = 0
            return
        with label("sfibench.selector"):  # a label for `sfibench profile`
            with label("sfibench.selector.logits"):  # the reference recomputes them from q and K
                keys = cache.k[layer, row, :, lo:hi]  # [H_kv, n, D]
                logits = torch.einsum("hgwd,hnd->hgwn", q.float(), keys.float()) * q.shape[-1] ** -0.5
                visible = torch.arange(lo, hi, device=q.device)[None, :] <= query_pos[:, None]  # [W, n]
                logits = logits.masked_fill(~visible, float("-inf")).flatten(1, 2)  # rows = G x W
            picks = select(logits, cache.key_norms[layer, row, :, lo:hi], lo, cfg.k_head, cfg.selector)
        self.selected[layer, row, :, : picks.shape[-1]] = picks
        self.selected_count[layer, row] = picks.shape[-1]

    def plan_step(self, ctx: StepContext) -> None:
        slow = self.scheduler.next_is_slow(ctx.step)
        self.scheduler.record_refresh(ctx.step, slow)
        self.slow_steps_taken += slow.long()
        ctx.slow = slow
        # The recent tail [anchor, L) grows until the layer's next refresh; size it for the longest.
        tail_start = self.anchor_host.clamp(min=self.cfg.n_sink)
        self.tail_width = ctx.bucketed(int((ctx.kv_lengths_host - tail_start).max()))

    def graph_key(self, ctx: StepContext) -> tuple | None:
        # Slow steps run the Selector, whose sizes follow the context: they stay eager.
        return None if bool(ctx.slow.any()) else (self.tail_width,)

    def _refreshes_layer(self, ctx: StepContext) -> torch.Tensor:
        """[B] bool on the host: sequences that run this layer densely and refresh it on this step."""
        if self.cfg.layer_groups == 1:
            return ctx.slow
        group = (self.slow_steps_taken - 1) % 2  # alternate on successive slow steps
        return ctx.slow & (group == ctx.layer % 2)

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext) -> torch.Tensor:
        layer, cfg = ctx.layer, self.cfg
        k, v = cache.k[layer], cache.v[layer]
        # Fast path for every sequence: sinks + selected (fixed) plus the recent tail [anchor, L).
        sinks = torch.arange(cfg.n_sink, device=q.device).expand(cache.batch, k.shape[1], -1)
        sinks_valid = sinks < ctx.kv_lengths[:, None, None]
        picks_valid = torch.arange(cfg.k_head, device=q.device) < self.selected_count[layer][:, None, None]
        fixed = torch.cat([sinks, self.selected[layer]], dim=-1)
        fixed_valid = torch.cat([sinks_valid, picks_valid.expand(-1, k.shape[1], -1)], dim=-1)
        tail_start = self.anchor[layer].clamp(min=cfg.n_sink)
        out, read = attend_fixed_plus_tail(q, k, v, fixed, fixed_valid, tail_start, ctx.kv_lengths, self.tail_width)
        refresh = self._refreshes_layer(ctx)
        for row in refresh.nonzero().flatten().tolist():  # slow sequences: exact dense output + refresh
            length = int(ctx.kv_lengths_host[row])
            out[row] = dense_attention(q[row:row + 1], k[row:row + 1], v[row:row + 1], ctx.kv_lengths[row:row + 1],
                                       capacity=length, masked=False)[0]
            read[row] = length
            grouped = q[row, :, 0].reshape(k.shape[1], -1, 1, q.shape[-1])  # [H_kv, G, W=1, D]
            self._refresh(cache, layer, row, length, grouped, ctx.positions[row:row + 1])
        ctx.tokens_read[layer] = read
        return out

    def observe(self, tokens: torch.Tensor) -> None:
        self.scheduler.observe(tokens)

    def summary(self) -> dict:
        return {"mean_slow_interval": self.scheduler.mean_interval()}
