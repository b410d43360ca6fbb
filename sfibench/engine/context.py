"""The per-step facts an attention method reads: one small object instead of threaded arguments."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepContext:
    """What the engine knows about the step being run.

    `positions[b]` is the cache slot (and RoPE position) of sequence b's query token; the cache is
    unpadded, so slot == position. `kv_lengths[b] = positions[b] + 1` once this step's key is written.
    `slow[b]` is the method's decision for sequence b (dense attention + refresh); it is a host (CPU)
    tensor because it steers Python control flow; methods without slow steps leave it False. The
    decoder sets `layer` before each layer's attention; the method writes how many cached tokens each
    (layer, sequence, KV head) read into `tokens_read`.

    Host copies of the lengths let a method size its tensors without a device sync. Those sizes are
    rounded up to `length_bucket` slots, so that a step captured in a CUDA graph can be replayed
    while the context grows; the slots between the true length and the bucket are masked, and
    count as wasted reads in throughput reports. Eager steps use a bucket of 1 (exact sizes).
    """

    step: int  # decode step index: 1, 2, ... (prefill is step 0)
    positions: torch.Tensor  # [B] long, on the device
    kv_lengths: torch.Tensor  # [B] long, on the device
    kv_lengths_host: torch.Tensor  # [B] long, on the CPU
    slow: torch.Tensor  # [B] bool, on the CPU
    tokens_read: torch.Tensor  # [n_layers, B, H_kv] long, on the device
    length_bucket: int = 1
    layer: int = 0

    @classmethod
    def for_decode(cls, step: int, lengths: torch.Tensor, lengths_host: torch.Tensor, num_layers: int,
                   num_kv_heads: int, length_bucket: int = 1) -> StepContext:
        batch = lengths.shape[0]
        return cls(
            step=step,
            positions=lengths,
            kv_lengths=lengths + 1,
            kv_lengths_host=lengths_host + 1,
            slow=torch.zeros(batch, dtype=torch.bool),
            tokens_read=torch.zeros(num_layers, batch, num_kv_heads, dtype=torch.long, device=lengths.device),
            length_bucket=length_bucket,
        )

    def bucketed(self, length: int) -> int:
        """`length` rounded up to the step's length bucket (the static size a kernel is given)."""
        return -(-length // self.length_bucket) * self.length_bucket
