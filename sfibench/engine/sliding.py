"""Sliding-window layers (Gemma-3's local layers): dense attention over the last `window` positions.

Such a layer is already sparse, so no attention method touches it: every method keeps it as the model
defines it and applies its selection to the global layers only (`ModelConfig.is_global`). The step
driver and the prefill call these functions for a sliding layer instead of the method's `attend`, and
count `min(window, L)` tokens read for it. K/V live in the same cache as every other layer's.
Plain PyTorch (SDPA), so they run on the CPU and on CUDA, inside a CUDA graph too: the decode read is
a fixed-width gather, whatever the length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def window_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lengths: torch.Tensor,
                            window: int) -> torch.Tensor:
    """Each sequence's query `[B, H_q, 1, D]` over its last `min(window, L_b)` cached positions.

    `k`, `v`: one layer's cache `[B, H_kv, S, D]`; `kv_lengths [B]` includes this step's token. The
    window is gathered at a static width (slots before 0 are clamped there and masked out), so the
    same kernels serve every length.
    """
    kv_heads, dim = k.shape[1], k.shape[-1]
    slots = kv_lengths[:, None] - window + torch.arange(window, device=q.device)  # [B, W]
    visible = slots >= 0
    index = slots.clamp(min=0)[:, None, :, None].expand(-1, kv_heads, -1, dim)
    return F.scaled_dot_product_attention(q, k.gather(2, index), v.gather(2, index),
                                          attn_mask=visible[:, None, None, :], enable_gqa=True)


def window_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                             window: int) -> torch.Tensor:
    """Queries at positions [start, start + T) over keys [0, start + T): causal, and each query sees
    only the `window` positions ending at its own (keys before the chunk's first window are not read)."""
    first = max(start - window + 1, 0)
    visible = additive_mask(q.shape[2], k.shape[2] - first, start - first, window, q.dtype, q.device)
    return F.scaled_dot_product_attention(q, k[:, :, first:], v[:, :, first:], attn_mask=visible, enable_gqa=True)


def additive_mask(queries: int, keys: int, offset: int, window: int | None, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """A prefill chunk's mask `[queries, keys]` as SDPA adds it: 0 where query i sees key c, -inf elsewhere.
    `offset` is the first query's position minus the first key's: query i sees key c when c - i <= offset
    and, with a `window`, c - i > offset - window. Built in place in the queries' dtype, so SDPA takes it as
    is: a boolean mask would be converted to this one beside it, and the comparisons building it are more
    tensors of the same size (a chunk of 2048 queries against 128K keys is 256M entries)."""
    mask = torch.full((queries, keys), float("-inf"), dtype=dtype, device=device).triu_(offset + 1)
    if window is not None:  # the keys that fell out of each query's window: a second band, added
        mask += torch.full_like(mask, float("-inf")).tril_(offset - window)
    return mask


def window_tokens_read(kv_lengths: torch.Tensor, window: int) -> torch.Tensor:
    """Tokens a sliding layer reads per sequence `[B]`."""
    return kv_lengths.clamp(max=window)
