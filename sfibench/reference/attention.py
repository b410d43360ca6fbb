"""Plain PyTorch attention over the shared KV cache: dense, and restricted to chosen positions.

Every method's reference path is built from these two functions, so methods differ only in which
positions they read. Shapes: q `[B, H_q, 1, D]`, cache K/V of one layer `[B, H_kv, S, D]`; the G query
heads of a KV head are `H_q // H_kv` consecutive query heads (the GQA convention of HF checkpoints).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lengths: torch.Tensor,
                    capacity: int, masked: bool = True) -> torch.Tensor:
    """Decode attention of each sequence over its first `kv_lengths[b]` cached positions.

    Reads the first `capacity` slots (a host int >= every length, so no device sync is needed) and
    masks each sequence's slots past its length; `masked=False` says every length equals capacity,
    which lets SDPA pick its fastest, mask-free kernel. A capacity past the cache's end is clipped.
    """
    capacity = min(capacity, k.shape[2])
    k, v = k[:, :, :capacity], v[:, :, :capacity]
    if not masked:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    visible = torch.arange(capacity, device=q.device) < kv_lengths[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None, None, :], enable_gqa=True)


def gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     valid: torch.Tensor) -> torch.Tensor:
    """Attention of each query over the cached positions `positions [B, H_kv, N]` of its KV head.

    One softmax over the gathered set; keys keep the RoPE of their original position. `valid [B, H_kv, N]`
    marks real entries (sets of different sizes are padded to N).
    """
    batch, q_heads, _, dim = q.shape
    kv_heads = k.shape[1]
    index = positions.unsqueeze(-1).expand(-1, -1, -1, dim)
    k_sel = k.gather(2, index)  # [B, H_kv, N, D]
    v_sel = v.gather(2, index)
    group = q_heads // kv_heads
    q_grouped = q.view(batch, kv_heads, group, dim)
    scores = torch.einsum("bhgd,bhnd->bhgn", q_grouped.float(), k_sel.float()) * dim**-0.5
    scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
    weights = scores.softmax(dim=-1)
    out = torch.einsum("bhgn,bhnd->bhgd", weights, v_sel.float())
    return out.reshape(batch, q_heads, 1, dim).to(q.dtype)
