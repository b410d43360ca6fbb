"""The per-step facts an attention method reads: one small object instead of threaded arguments."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepContext:
    """What the engine knows about the step being run.

    `positions[b]` is the cache slot (and RoPE position) of sequence b's query token; the cache is
    unpadded, so slot == position. `kv_lengths[b] = positions[b] + 1` once this step's key is written.
    `slow[b]` is the method's decision for sequence b (dense attention + refresh); methods without
    slow steps leave it False. The decoder sets `layer` before each layer's attention; the method
    writes how many cached tokens each (layer, sequence, KV head) read into `tokens_read`.
    """

    step: int  # decode step index: 1, 2, ... (prefill is step 0)
    positions: torch.Tensor  # [B] long
    kv_lengths: torch.Tensor  # [B] long
    slow: torch.Tensor  # [B] bool
    tokens_read: torch.Tensor  # [n_layers, B, H_kv] long
    layer: int = 0

    @classmethod
    def for_decode(cls, step: int, lengths: torch.Tensor, num_layers: int, num_kv_heads: int) -> StepContext:
        batch = lengths.shape[0]
        return cls(
            step=step,
            positions=lengths.clone(),
            kv_lengths=lengths + 1,
            slow=torch.zeros(batch, dtype=torch.bool, device=lengths.device),
            tokens_read=torch.zeros(num_layers, batch, num_kv_heads, dtype=torch.long, device=lengths.device),
        )
