"""StreamingLLM and SnapKV on the optimized path: fixed selections through the same two-segment kernel.

Both read "a fixed set + a contiguous tail", the shape the optimized SFI fast step reads, so they run
through the same Triton kernel and every speed comparison is between equally optimized methods.
StreamingLLM's fixed set is the sinks, which already lie contiguous at the start of the cache (the
kernel reads them in place through a view), and its tail the sliding window. SnapKV's fixed set is
the kept prompt tokens, copied once after prefill into a compact buffer (with the tail's first rows up
to a tile edge, as SFI's refresh fills its own), and its tail everything after them.
"""

from __future__ import annotations

import torch

from sfibench.baselines.snapkv import SnapKV
from sfibench.baselines.streaming_llm import StreamingLLM
from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.methods import register
from sfibench.optimized.decode_attention import tile_rows
from sfibench.optimized.full_kv import require_triton_device
from sfibench.optimized.tail_state_kernel import begin_tail_step
from sfibench.optimized.two_segment import fast_read_launch, two_segment_decode


class _TwoSegment:
    """Shared attend: per layer one launch over compact[layer] + the cache tail [tail_start, L)."""

    def choose_splits(self, cache: KVCache) -> None:
        """Split count and loop form for a read of about `budget` rows (SnapKV's grows by one row per step; the count
        only changes speed), the rule the SFI fast step uses."""
        self.launch = fast_read_launch(cache.batch, self.model_config.num_kv_heads, self.cfg.budget, cache.k.device)

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan) -> torch.Tensor:
        layer = ctx.layer
        out = two_segment_decode(q[:, :, 0], *self.compact(cache, layer), self.counts[:, layer],
                                 cache.k[layer], cache.v[layer], self.tail, ctx.kv_lengths, self.row_buffer,
                                 index_before_wait=True, **self.launch)  # indices are written in begin_step
        return out[:, :, None]

    def begin_step(self, ctx: StepContext, plan) -> None:
        # The fixed rows and tail start of each row (StreamingLLM's move with the length, SnapKV's do not) and
        # the tokens every (layer, row, KV head) reads, in one launch.
        begin_tail_step(ctx.kv_lengths, self.counts, self.tail, ctx.tokens_read, self.moving_segments)


@register("streaming_llm", "optimized")
class OptimizedStreamingLLM(_TwoSegment, StreamingLLM):
    def start(self, cache: KVCache, prefilled) -> None:
        require_triton_device(cache.k.device)
        self.choose_splits(cache)
        mc, device = self.model_config, cache.k.device
        self.state("counts", (1, mc.num_layers, cache.batch, mc.num_kv_heads), torch.int32, device)
        self.state("tail", (1, cache.batch), torch.int32, device)
        self.state("row_buffer", (cache.batch,), torch.int32, device)

    def compact(self, cache: KVCache, layer: int):
        sinks = slice(0, self.cfg.n_sink)  # a view: the sinks already sit contiguous in the cache
        return cache.k[layer, :, :, sinks][None], cache.v[layer, :, :, sinks][None]

    @property
    def moving_segments(self) -> tuple[int, int]:
        """(n_sink, window): the sinks are the first min(L, n_sink) slots, the window the last `window` slots
        after them."""
        return self.cfg.n_sink, self.cfg.budget - self.cfg.n_sink


@register("snapkv", "optimized")
class OptimizedSnapKV(_TwoSegment, SnapKV):
    def start(self, cache: KVCache, prefilled) -> None:
        require_triton_device(cache.k.device)
        self.choose_splits(cache)
        super().start(cache, prefilled)  # chooses self.kept, self.kept_count and self.tail_start
        mc, device, keep = self.model_config, cache.k.device, self.kept.shape[-1]
        # As SFI's refresh does (SelectionState._rebuild_compact): the kept rows are followed by the tail's
        # first rows up to a tile edge, and the tail is read after them: the same rows, no padded tile. A
        # compressed row's tail holds at least the observation window when this runs.
        moved = min(-keep % tile_rows(mc.head_dim, cache.k.element_size()), self.cfg.window)
        compressed = (self.kept_count > 0).long() * moved  # [B]: rows that kept the whole prompt move nothing
        window = self.tail_start[None, :, None, None] + torch.arange(moved, device=device)  # [1, B, 1, moved]
        positions = torch.cat([self.kept, window.expand(mc.num_layers, -1, mc.num_kv_heads, -1)], dim=-1)
        shape = (1, mc.num_layers, cache.batch, mc.num_kv_heads, keep + moved, mc.head_dim)
        self.state("compact_k", shape, cache.k.dtype, device)
        self.state("compact_v", shape, cache.k.dtype, device)
        # (a row that kept its whole prompt reads no compact rows; its `window` may run past a short cache)
        index = positions.clamp(max=cache.max_seq - 1)[..., None].expand(-1, -1, -1, -1, mc.head_dim)
        self.compact_k[0] = cache.k.gather(3, index)  # [L, B, H_kv, keep + moved, D]
        self.compact_v[0] = cache.v.gather(3, index)
        self.state("counts", (1, mc.num_layers, cache.batch, mc.num_kv_heads), torch.int32, device)
        self.counts.copy_((self.kept_count + compressed)[None, None, :, None].expand_as(self.counts))
        self.state("tail", (1, cache.batch), torch.int32, device).copy_((self.tail_start + compressed)[None])
        self.state("row_buffer", (cache.batch,), torch.int32, device)

    def plan(self, ctx: StepContext):
        return super(SnapKV, self).plan(ctx)  # no static sizes: the kernel reads every length on the device

    def compact(self, cache: KVCache, layer: int):
        return self.compact_k[:, layer], self.compact_v[:, layer]

    moving_segments = None  # the kept prompt rows and the tail's start are fixed after prefill
