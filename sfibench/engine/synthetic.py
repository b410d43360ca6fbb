"""Synthetic prefill: fill the KV cache with random keys and values instead of running the prompt.

Decode speed depends on how much cache each step reads, not on what it holds, so long-context speed
runs may skip a minutes-long prefill. Reports say when a run used this. Keys are drawn with the
spread of real post-RoPE keys (unit variance per dimension); the stored "last prompt queries" and
logits are random too, so method bootstraps (SFI, SnapKV) do their full work on arbitrary evidence.
"""

from __future__ import annotations

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.prefill import Prefilled


@torch.no_grad()
def synthetic_prefill(cache: KVCache, context: int, vocab_size: int, num_heads: int, evidence_rows: int = 64,
                      seed: int = 0) -> Prefilled:
    layers, batch, kv_heads, _, dim = cache.k.shape
    generator = torch.Generator(device=cache.k.device).manual_seed(seed)
    for layer in range(layers):  # one layer at a time keeps the float32 scratch small
        for tensor in (cache.k, cache.v):
            chunk = torch.randn((batch, kv_heads, context, dim), generator=generator, device=cache.k.device)
            tensor[layer, :, :, :context] = chunk.to(tensor.dtype)
        cache.key_norms[layer, :, :, :context] = cache.k[layer, :, :, :context].float().norm(dim=-1)
    lengths = torch.full((batch,), context, device=cache.k.device)
    cache.set_lengths(lengths)
    rows = min(evidence_rows, context)
    queries = torch.randn((layers, batch, num_heads, evidence_rows, dim), generator=generator,
                          device=cache.k.device).to(cache.k.dtype)
    logits = torch.randn((batch, vocab_size), generator=generator, device=cache.k.device)
    return Prefilled(lengths, logits, queries, torch.full((batch,), rows, device=cache.k.device))
