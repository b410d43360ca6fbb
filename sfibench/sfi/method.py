"""What both SFI paths share: triggers, layer groups, bridge steps, the bootstrap and the refresh.

A path (reference/sfi.py, optimized/sfi.py) adds only how it attends and where a slow step's evidence
comes from. Per step, on the host, `plan` asks the trigger scheduler which sequences are slow, turns
that into per-(layer, sequence) masks (which layers refresh under `layer_groups`, which read densely),
and copies them to the device, where the captured step reads them. After the step, `after_step` runs
the Selector for every refreshed (layer, sequence) and publishes the new selection (sfi/state.py).

Only global layers select, refresh or read densely: a sliding-window layer (Gemma-3's local layers)
attends its window in the engine whatever the method, so it never has a selection. `layer_groups` = 2
alternates over the global layers in order (the 1st, 3rd, ... one, then the 2nd, 4th, ...).
"""

from __future__ import annotations

import torch

from sfibench.core.labels import label
from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.method import AttentionMethod, StepPlan
from sfibench.engine.prefill import Prefilled
from sfibench.sfi import geometry
from sfibench.sfi.config import EVIDENCE_CHUNK_BYTES, PUBLISH_POLICIES
from sfibench.sfi.selector import select
from sfibench.sfi.state import SelectionState
from sfibench.sfi.transfer import layer_index, pinned
from sfibench.sfi.triggers import SlowStepScheduler, token_byte_table, token_classes



class SFIMethod(AttentionMethod):
    name = "sfi"
    has_slow_steps = True
    compact = None  # the optimized path keeps compact copies of the selected K/V, gathered by this function
    compact_align = 1  # ... whose rows it fills up to a multiple of this (SelectionState._rebuild_compact)
    select = staticmethod(select)  # the Selector; the optimized path swaps in its Triton version

    def __init__(self, config, model_config, tokenizer):
        super().__init__(config, model_config, tokenizer)
        if self.cfg.layer_groups not in (1, 2):
            raise ValueError(f"layer_groups must be 1 or 2, got {self.cfg.layer_groups}")
        if self.cfg.publish not in PUBLISH_POLICIES:
            raise ValueError(f"unknown publish policy {self.cfg.publish!r}; valid: {', '.join(PUBLISH_POLICIES)}")
        self.token_bytes = token_byte_table(tokenizer.backend, model_config.vocab_size)
        self.is_ender, self.is_blank = token_classes(tokenizer.backend, model_config.vocab_size, self.token_bytes)
        self.sel: SelectionState | None = None
        global_layers = model_config.global_layers
        self.global_rows = torch.zeros(model_config.num_layers, 1, dtype=torch.bool)  # [L, 1]: this layer selects
        self.global_rows[global_layers] = True
        # The layer group of each layer under layer_groups = 2: its index among the global layers, mod 2
        self.layer_group = torch.zeros(model_config.num_layers, 1, dtype=torch.long)
        self.layer_group[global_layers, 0] = torch.arange(len(global_layers)) % 2

    # --- per batch -------------------------------------------------------------------------------
    def start(self, cache: KVCache, prefilled: Prefilled) -> None:
        mc, batch, device = self.model_config, cache.batch, cache.k.device
        self.cache = cache
        shape = (mc.num_layers, batch)
        if self.sel is None or self.sel.live.shape != shape or self.sel.positions.device != device:
            compact = (mc.head_dim, cache.k.dtype, self.compact) if self.compact else (None, None, None)
            self.sel = SelectionState(self.cfg, mc.num_layers, batch, mc.num_kv_heads, device, *compact,
                                      align=self.compact_align)
        else:
            self.sel.reset()  # in place: captured CUDA graphs keep reading these tensors
        self.state("refresh_rows", shape, torch.bool, device)  # this step's (layer, row) refreshes
        self.state("dense_rows", shape, torch.bool, device)  # ... and which read their whole history
        self.masks_sent = {}  # the host masks last copied into refresh_rows / dense_rows (see plan)
        self.slow_steps_taken = torch.zeros(batch, dtype=torch.long)  # picks the layer group to refresh
        self.scheduler = SlowStepScheduler(self.cfg.trigger, self.is_ender, self.is_blank, batch, self.token_bytes)
        self.bootstrap(cache, prefilled)

    def bootstrap(self, cache: KVCache, prefilled: Prefilled) -> None:
        """The first selection of every row, from its prompt (the optimized path may run it on a side stream)."""
        for row in range(cache.batch):
            rows = min(self.cfg.w_prefill, int(prefilled.query_counts[row]))
            self.refresh(cache, row, self.model_config.global_layers, int(prefilled.lengths[row]),
                         lambda lo, hi, layers, row=row: self.bootstrap_evidence(cache, prefilled, row, layers, lo, hi),
                         query_rows=rows)

    def bootstrap_evidence(self, cache: KVCache, prefilled: Prefilled, row: int, layers: list[int], lo: int,
                           hi: int) -> torch.Tensor:
        """Prefill is slow step 0: evidence = the last w_prefill prompt queries, causally masked.

        Returns logits `[len(layers), H_kv, G * W, hi - lo]` over the candidates."""
        group, count = self.model_config.group_size, int(prefilled.query_counts[row])
        rows = min(self.cfg.w_prefill, count)
        query_pos = prefilled.query_positions(row)[count - rows:].to(cache.k.device)
        visible = torch.arange(lo, hi, device=cache.k.device)[None, :] <= query_pos[:, None]  # [W, n]
        out = []
        for layer in layers:
            q = prefilled.queries[layer, row, :, count - rows:count]  # [H_q, W, D]
            q = q.reshape(-1, group, rows, q.shape[-1])
            logits = candidate_logits(q, cache.k[layer, row, :, lo:hi])
            out.append(logits.masked_fill(~visible, float("-inf")).flatten(1, 2))
        return torch.stack(out)

    # --- per step --------------------------------------------------------------------------------
    def plan(self, ctx: StepContext) -> StepPlan:
        slow = self.scheduler.next_is_slow(ctx.step)
        self.scheduler.record_refresh(ctx.step, slow)
        self.slow_steps_taken += slow.long()
        ctx.slow = slow
        refresh = slow[None, :] & self.global_rows  # [L, B]
        if self.cfg.layer_groups == 2:  # alternate the two groups of global layers on successive slow steps
            refresh &= self.layer_group == (self.slow_steps_taken - 1) % 2
        dense = refresh | (self.global_rows & (ctx.step <= self.cfg.bridge_steps))
        self.refresh_host, self.dense_host = refresh, dense
        ctx.bridge = (dense & ~refresh).any(dim=0) & ~slow  # read densely without refreshing: a bridge step
        self.send_mask("refresh_rows", refresh)
        self.send_mask("dense_rows", dense)
        return self.path_plan(ctx)

    def send_mask(self, name: str, mask: torch.Tensor) -> None:
        """Copy a host mask into the device buffer `name`, unless it holds that mask already: on most steps
        (fast ones) both masks are all False, and each copy is a host-to-device transfer in the step's stream.

        The copy goes through pinned memory: from pageable memory it would wait for the stream to drain, so
        the host could never queue the next step ahead of the GPU."""
        sent = self.masks_sent.get(name)
        if sent is not None and torch.equal(sent, mask):
            return
        getattr(self, name).copy_(pinned(mask), non_blocking=True)
        self.masks_sent[name] = mask

    def path_plan(self, ctx: StepContext) -> StepPlan:
        raise NotImplementedError

    def begin_step(self, ctx: StepContext, plan: StepPlan) -> None:
        self.sel.begin_step()

    def after_step(self, ctx: StepContext, plan: StepPlan) -> None:
        for row in self.refresh_host.any(dim=0).nonzero().flatten().tolist():
            layers = self.refresh_host[:, row].nonzero().flatten().tolist()
            self.refresh(self.cache, row, layers, int(ctx.kv_lengths_host[row]),
                         lambda lo, hi, layers, row=row: self.decode_evidence(row, layers, lo, hi))

    def refresh(self, cache: KVCache, row: int, layers: list[int], length: int, evidence, query_rows: int = 1) -> None:
        """Select anew for `layers` of `row` at KV length `length`; `evidence(lo, hi, layers)` gives the logits
        of `query_rows` queries per query head (1 at decode, up to w_prefill at the bootstrap) over [lo, hi).

        With `evidence_norm = "visible"` the evidence is taken over the whole history [0, length) and split
        into the candidates' logits and each row's log-sum-exp outside them (visible_evidence). Layers are
        taken in chunks so the float32 evidence stays under EVIDENCE_CHUNK_BYTES. `layers` index the device
        as a slice or through pinned memory, never as a Python list (which syncs the stream)."""
        lo, hi = geometry.candidate_range(length, self.cfg)
        visible = self.cfg.selector.evidence_norm == "visible"
        heads = self.model_config.num_kv_heads
        rows_per_layer = heads * self.model_config.group_size * query_rows
        width = length if visible else hi - lo
        chunk = max(1, EVIDENCE_CHUNK_BYTES // (rows_per_layer * max(width, 1) * 4))
        for first in range(0, len(layers), chunk):
            part = layers[first:first + chunk]
            with label("sfibench.selector"):  # labels for `sfibench profile`
                if hi <= lo:  # no candidates yet: sinks + recent already cover the whole history
                    picks = torch.empty(len(part), heads, 0, dtype=torch.long, device=cache.k.device)
                else:
                    with label("sfibench.selector.logits"):
                        if visible:
                            logits, outside_lse = visible_evidence(evidence(0, length, part), lo, hi)
                        else:
                            logits, outside_lse = evidence(lo, hi, part), None
                    norms = cache.key_norms[layer_index(part, cache.k.device), row, :, lo:hi]
                    picks = self.select(logits, norms, lo, self.cfg.k_head, self.cfg.selector, outside_lse)
            with label("sfibench.rebuild"):
                self.sel.publish(part, row, self.sel.write(part, row, picks, length, cache))

    def decode_evidence(self, row: int, layers: list[int], lo: int, hi: int) -> torch.Tensor:
        """This step's logits `[len(layers), H_kv, G, hi - lo]` of `row` over the candidates."""
        raise NotImplementedError

    def observe(self, tokens: torch.Tensor) -> None:
        self.scheduler.observe(tokens)

    def summary(self) -> dict:
        return {"mean_slow_interval": self.scheduler.mean_interval()}


def visible_evidence(logits: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split logits over the whole history `[..., R, L]` into those over the candidates [lo, hi) and each
    row's log-sum-exp over the rest (sinks and recent window) `[..., R, 1]`: what the Selector needs to
    softmax a row over every key it sees (-inf where the row sees nothing outside C)."""
    outside = torch.cat([logits[..., :lo], logits[..., hi:]], dim=-1)
    return logits[..., lo:hi], torch.logsumexp(outside.float(), dim=-1, keepdim=True)


def candidate_logits(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Attention logits q.k/sqrt(d) in float32: q `[H_kv, G, W, D]`, keys `[H_kv, n, D]` -> `[H_kv, G, W, n]`."""
    return torch.einsum("hgwd,hnd->hgwn", q.float(), keys.float()) * q.shape[-1] ** -0.5
