"""The optimized path of the methods that read "a fixed set + a contiguous tail" (StreamingLLM, SnapKV).

That is the shape the optimized SFI's fast step reads, so they run through the same two-segment Triton
kernel (optimized/two_segment.py) and every speed comparison is between equally optimized methods. A
method supplies its fixed rows per layer (`compact`) and, in `start`, the device tensors `counts`
(fixed rows per layer, row and KV head), `tail` (each row's tail start) and `row_buffer`.
"""

from __future__ import annotations

import torch

from sfibench.optimized.tail_state_kernel import begin_tail_step
from sfibench.optimized.two_segment import fast_read_launch, two_segment_decode


class TwoSegmentPath:
    """Mixin: per layer one launch over compact[layer] + the cache tail [tail_start, L)."""

    moving_segments = None  # (n_sink, window) when the fixed rows and the tail move with the length

    def choose_splits(self, cache, rows: int) -> None:
        """Split count and loop form for a read of about `rows` rows (SnapKV's grows by one row per step; the
        count only changes speed), the rule the SFI fast step uses."""
        self.launch = fast_read_launch(cache.batch, self.model_config.num_kv_heads, rows, cache.k.device)

    def attend(self, q: torch.Tensor, cache, ctx, plan) -> torch.Tensor:
        layer = ctx.layer
        out = two_segment_decode(q[:, :, 0], *self.compact(cache, layer), self.counts[:, layer],
                                 cache.k[layer], cache.v[layer], self.tail, ctx.kv_lengths, self.row_buffer,
                                 index_before_wait=True, **self.launch)  # indices are written in begin_step
        return out[:, :, None]

    def begin_step(self, ctx, plan) -> None:
        # The fixed rows and tail start of each row (StreamingLLM's move with the length, SnapKV's do not) and
        # the tokens every (layer, row, KV head) reads, in one launch.
        begin_tail_step(ctx.kv_lengths, self.counts, self.tail, ctx.tokens_read, self.moving_segments)
