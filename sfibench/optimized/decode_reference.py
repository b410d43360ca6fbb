"""Float64 torch references for the decode-attention kernels in decode_attention.py.

Deliberately plain: a loop over sequences and KV heads, each an ordinary softmax over exactly the
keys it should see, so a reader can check them by eye. Same shapes and arguments as the kernels.
"""

from __future__ import annotations

import math

import torch


def _attend(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One KV head in float64: queries `[G, D]`, keys/values `[n, D]` -> `[G, D]`."""
    scores = queries.double() @ keys.double().T / math.sqrt(queries.shape[-1])
    return scores.softmax(dim=-1) @ values.double()


def dense_decode_reference(q, k, v, lengths) -> torch.Tensor:
    """float64 `[B, H_q, D]`: per sequence and KV head, softmax attention over slots [0, lengths[b])."""
    batch, q_heads, head_dim = q.shape
    group = q_heads // k.shape[1]
    out = torch.empty(batch, q_heads, head_dim, dtype=torch.float64, device=q.device)
    for b in range(batch):
        n = int(lengths[b])
        for h in range(k.shape[1]):
            out[b, h * group:(h + 1) * group] = _attend(q[b, h * group:(h + 1) * group], k[b, h, :n], v[b, h, :n])
    return out


def sparse_decode_reference(q, k, v, positions, counts) -> torch.Tensor:
    """float64 `[B, H_q, D]`: per sequence and KV head, attention over `positions[b, h, :counts[b, h]]`."""
    batch, q_heads, head_dim = q.shape
    group = q_heads // k.shape[1]
    out = torch.empty(batch, q_heads, head_dim, dtype=torch.float64, device=q.device)
    for b in range(batch):
        for h in range(k.shape[1]):
            slots = positions[b, h, :int(counts[b, h])].long()
            out[b, h * group:(h + 1) * group] = _attend(q[b, h * group:(h + 1) * group], k[b, h, slots],
                                                         v[b, h, slots])
    return out
