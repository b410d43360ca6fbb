"""The per-step facts an attention method reads: one small object instead of threaded arguments."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sfibench.engine.workspace import round_up


@dataclass
class StepContext:
    """What the engine knows about the step being run.

    `positions[b]` is the cache slot of sequence b's query token; the cache is unpadded, so slot ==
    position, except in a compact cache (engine/compact.py), whose slots are counted without the prompt
    positions the method dropped (the step driver rotates at the original position). `kv_lengths[b] =
    positions[b] + 1` once this step's key is written.
    Both are device tensors the step driver owns and updates in place (a CUDA graph reads them at
    their captured addresses). `slow[b]` is the method's host-side decision for sequence b, used for
    reporting; the attention itself reads the method's device copy of it. The decoder sets `layer`
    before each layer's attention; the method writes how many cached tokens each (layer, sequence, KV
    head) read into `tokens_read`.

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
    bridge: torch.Tensor | None = None  # [B] bool, on the CPU: SFI bridge rows (dense, no refresh)
    layer: int = 0

    def bucketed(self, length: int) -> int:
        """`length` rounded up to the step's length bucket (the static size a kernel is given)."""
        return round_up(length, self.length_bucket)
