"""The sparse memory a fast step reads, and attention over it.

Every sparse method here reads "a fixed set of positions + a contiguous tail [tail_start, L)":
SFI's fixed set is sinks + selected and its tail the recent window; StreamingLLM's is the sinks and
a sliding window; SnapKV's is the kept prompt tokens and everything generated since. So one function
builds the position lists, attends, and counts exactly the tokens it read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sfibench.core.labels import label
from sfibench.engine.method import StepPlan
from sfibench.reference.attention import gather_attention


@dataclass(frozen=True)
class TailPlan(StepPlan):
    tail_width: int = 1  # static bound on L - tail_start over the batch (bucketed)



def attend_fixed_plus_tail(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fixed: torch.Tensor,
                           fixed_valid: torch.Tensor, tail_start: torch.Tensor, kv_lengths: torch.Tensor,
                           tail_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend over `fixed [B, H_kv, F]` (where `fixed_valid`) plus every slot in [tail_start[b], L_b).

    `tail_width` is a host-side bound on L_b - tail_start[b] (static, so the step can be graphed).
    The caller guarantees the fixed positions lie below `tail_start`, so no slot is read twice.
    Returns the attention output `[B, H_q, 1, D]` and the tokens read `[B, H_kv]`.
    """
    batch, kv_heads = fixed.shape[:2]
    # The reference path rebuilds this index list every step and gathers K/V through it; it keeps no
    # compact copy of the selected K/V, so this is its whole "compact rebuild" cost.
    with label("sfibench.sparse_index"):  # a label for `sfibench profile`
        tail_len = (kv_lengths - tail_start).clamp(min=0)  # [B]
        width = max(tail_width, 1)
        offsets = torch.arange(width, device=q.device)
        tail = (tail_start[:, None] + offsets).clamp(max=k.shape[2] - 1)  # clamped slots are masked out
        tail_valid = offsets < tail_len[:, None]
        positions = torch.cat([fixed, tail[:, None, :].expand(batch, kv_heads, width)], dim=-1)
        valid = torch.cat([fixed_valid, tail_valid[:, None, :].expand(batch, kv_heads, width)], dim=-1)
    out = gather_attention(q, k, v, positions, valid)
    return out, valid.sum(dim=-1)
