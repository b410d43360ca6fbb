"""Float64 torch references for the decode-attention kernels in decode_attention.py and two_segment.py.

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


def two_segment_decode_reference(q, compact_k, compact_v, compact_counts, k, v, tail_start, lengths, row_buffer,
                                 evidence_rows=None):
    """(out float64 `[B, H_q, D]`, logits float64 `[B, H_q, S]` or None) for two_segment.two_segment_decode.

    Row b reads buffer p = row_buffer[b]: compact rows [0, compact_counts[p, b, h]) then cache slots
    [tail_start[p, b], lengths[b]); a negative p reads cache slots [0, lengths[b]) only. With
    `evidence_rows`, logits holds q.k/sqrt(D) at every tail slot of the rows marked non-zero, NaN elsewhere
    (where the kernel writes nothing).
    """
    batch, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    out = torch.empty(batch, q_heads, head_dim, dtype=torch.float64, device=q.device)
    logits = None if evidence_rows is None else torch.full((batch, q_heads, k.shape[2]), math.nan,
                                                           dtype=torch.float64, device=q.device)
    for b in range(batch):
        p, dense = max(int(row_buffer[b]), 0), int(row_buffer[b]) < 0
        first_slot = 0 if dense else int(tail_start[p, b])
        tail = torch.arange(first_slot, max(first_slot, min(int(lengths[b]), k.shape[2])), device=q.device)
        for h in range(kv_heads):
            heads = slice(h * group, (h + 1) * group)
            count = 0 if dense else int(compact_counts[p, b, h])
            keys = torch.cat([compact_k[p, b, h, :count], k[b, h, tail]])
            values = torch.cat([compact_v[p, b, h, :count], v[b, h, tail]])
            out[b, heads] = _attend(q[b, heads], keys, values)
            if logits is not None and evidence_rows[b]:
                logits[b, heads, tail] = q[b, heads].double() @ k[b, h, tail].double().T / math.sqrt(head_dim)
    return out, logits
