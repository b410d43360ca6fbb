"""Slow-Fast Inference, optimized path: one Triton kernel per layer and step, the Selector off the critical path.

A fast row reads two segments in one launch (optimized/two_segment.py): the compact copy of its sinks'
and selected tokens' K/V, contiguous, and the recent window in place in the cache. A slow row is the
same launch with an empty compact segment and a tail starting at 0, i.e. dense attention, and the
kernel also writes that row's logits q.k/sqrt(d) to an evidence buffer, so the Selector needs no
second pass over K. Which rows are slow is device data (`row_buffer`, `refresh_rows`), so a step is
one CUDA graph whatever the mix of slow and fast rows; the plan only says whether evidence is written.

After a slow step the Selector (sfi/selector.py) and the compact rebuild (sfi/state.py) run on the
evidence. With `publish = next_step` they run on the main stream right after the step (synchronous:
the slow step pays for them, and the result matches the reference path). With `when_ready` they are
enqueued on a second CUDA stream and publish their buffer when done; until then the rows keep their
previous selection (or, right after prefill, read densely: the bridge of the authors' pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.method import StepPlan
from sfibench.optimized.compact_kernels import gather_compact
from sfibench.optimized.decode_attention import tile_rows
from sfibench.optimized.top_k_kernels import radix_top_k
from sfibench.optimized.triton_device import require_triton_device
from sfibench.optimized.selector_kernels import ScoreParams, fused_scores
from sfibench.optimized.step_state_kernel import take_published
from sfibench.optimized.two_segment import dense_read_launch, fast_read_launch, two_segment_decode
from sfibench.sfi import geometry
from sfibench.sfi.method import SFIMethod
from sfibench.sfi.selector_config import SelectorConfig
from sfibench.sfi.selector import keep_neighbours, select
from sfibench.sfi.transfer import layer_index


def score_params(cfg: SelectorConfig) -> ScoreParams:
    """The Selector's numbers as the score kernels take them."""
    return ScoreParams(**{f.name: getattr(cfg, f.name) for f in fields(ScoreParams)})


def fused_select(logits: torch.Tensor, key_norms: torch.Tensor, lo: int, k: int, cfg: SelectorConfig,
                 outside_lse: torch.Tensor | None = None) -> torch.Tensor:
    """`select` (sfi/selector.py) through the Triton Selector (optimized/selector_kernels.py) and top-K
    (optimized/top_k_kernels.py); same arguments, same result up to rounding. The --evidence-norm visible
    ablation goes to `select` itself."""
    if outside_lse is not None or cfg.evidence_norm != "candidates" or logits.shape[-1] == 0 or logits.dim() != 4:
        return select(logits, key_norms, lo, k, cfg, outside_lse)
    scores = fused_scores(logits.float(), key_norms, score_params(cfg))
    if cfg.keep_neighbours > 1:
        scores = keep_neighbours(scores, cfg.keep_neighbours)
    return radix_top_k(scores, k, lo)


@dataclass(frozen=True)
class OptimizedSFIPlan(StepPlan):
    evidence: bool = False  # some row refreshes after this step: the kernel writes its logits
    dense: bool = False  # some row may read its whole history: split the kernel for a long read


class OptimizedSFI(SFIMethod):
    compact = staticmethod(gather_compact)
    select = staticmethod(fused_select)

    def start(self, cache: KVCache, prefilled) -> None:
        device, mc = cache.k.device, self.model_config
        require_triton_device(device)
        layers, batch = mc.num_layers, cache.batch
        # Compact segments end on a tile edge of the kernel's loop over them (SelectionState._rebuild_compact)
        self.compact_align = tile_rows(mc.head_dim, cache.k.element_size())
        self.state("row_buffer", (layers, batch), torch.int32, device)  # compact buffer per row, -1 = dense
        # A step with a dense row splits for that row's long read; a step of fast rows reads a few thousand
        # rows each (at most the memory right after a refresh plus t_max steps of growth): its split count
        # and loop form are chosen for those rows.
        self.dense_launch = dense_read_launch(batch, mc.num_kv_heads, cache.max_seq, device)
        fast_rows = geometry.tokens_read_after_refresh(cache.max_seq, self.cfg) + self.cfg.trigger.t_max
        self.fast_launch = fast_read_launch(batch, mc.num_kv_heads, fast_rows, device)
        # Dense logits of every query head at every slot, written only for refreshing rows.
        self.state("evidence", (layers, batch, mc.num_heads, cache.max_seq), torch.float32, device)
        async_refresh = self.cfg.publish == "when_ready" and device.type == "cuda"
        if getattr(self, "side", None) is not None:  # the last batch's refresh may still be publishing
            torch.cuda.current_stream().wait_stream(self.side)
        self.side = torch.cuda.Stream(device) if async_refresh else None
        self.pending: dict[int, torch.cuda.Event] = {}  # row -> its refresh still in flight
        super().start(cache, prefilled)

    def bootstrap(self, cache: KVCache, prefilled) -> None:
        # Asynchronously, rows read densely until their bootstrap selection is published (the bridge).
        self._on_refresh_stream(lambda: super(OptimizedSFI, self).bootstrap(cache, prefilled), range(cache.batch))
        self.unpublished = set(self.pending.values())  # the bootstrap's event, until it has run

    def path_plan(self, ctx: StepContext) -> OptimizedSFIPlan:
        # A row about to refresh again must not overwrite evidence or buffers its last refresh still reads.
        for row in self.refresh_host.any(dim=0).nonzero().flatten().tolist():
            if row in self.pending:
                torch.cuda.current_stream().wait_event(self.pending.pop(row))
        # Until the bootstrap is published rows read densely; the host cannot know when, so it asks the
        # event (without waiting) and plans a dense split count until then.
        self.unpublished = {event for event in self.unpublished if not event.query()}
        dense = bool(self.dense_host.any()) or bool(self.unpublished)
        return OptimizedSFIPlan(evidence=bool(self.refresh_host.any()), dense=dense)

    def begin_step(self, ctx: StepContext, plan: OptimizedSFIPlan) -> None:
        # SelectionState.begin_step (live = published), the kernel's row buffers and the step's tokens read
        # (compact rows + the tail per KV head, or the whole history), all layers in one launch.
        sel = self.sel
        take_published(sel.published, self.dense_rows, sel.compact_counts, sel.tail_start, ctx.kv_lengths,
                       sel.live, self.row_buffer, ctx.tokens_read)

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan: OptimizedSFIPlan) -> torch.Tensor:
        layer, sel = ctx.layer, self.sel
        out = two_segment_decode(
            q[:, :, 0], sel.compact_k[:, layer], sel.compact_v[:, layer], sel.compact_counts[:, layer],
            cache.k[layer], cache.v[layer], sel.tail_start[:, layer], ctx.kv_lengths, self.row_buffer[layer],
            index_before_wait=True,  # written before the step or published by the side stream, never by the append
            **(self.dense_launch if plan.dense else self.fast_launch),
            **({"evidence": self.evidence[layer], "evidence_rows": self.refresh_rows[layer]} if plan.evidence else {}))
        return out[:, :, None]

    def after_step(self, ctx: StepContext, plan: OptimizedSFIPlan) -> None:
        if plan.evidence:
            rows = self.refresh_host.any(dim=0).nonzero().flatten().tolist()
            self._on_refresh_stream(lambda: super(OptimizedSFI, self).after_step(ctx, plan), rows)

    def _on_refresh_stream(self, work, rows) -> None:
        """Run `work` (Selector + rebuild + publish) on the side stream, after what the main stream queued."""
        if self.side is None:
            work()
            return
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            work()
        event = torch.cuda.Event()
        event.record(self.side)
        for row in rows:
            self.pending[row] = event

    def decode_evidence(self, row: int, layers: list[int], lo: int, hi: int) -> torch.Tensor:
        group = self.model_config.group_size
        logits = self.evidence[layer_index(layers, self.evidence.device), row, :, lo:hi]  # the slow step wrote it
        return logits.view(len(layers), -1, group, hi - lo)  # a view when the layers are evenly spaced
