"""Synthetic prefill: fill the KV cache with random keys and values instead of running the prompt.

Decode speed depends on how much cache each step reads, not on what it holds, so long-context speed
runs may skip a minutes-long prefill. Reports say when a run used this. Keys are drawn with the
spread of real post-RoPE keys (unit variance per dimension); the stored "last prompt queries" and
logits are random too, so method bootstraps (SFI, SnapKV) do their full work on arbitrary evidence.
"""

from __future__ import annotations

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.memory_phases import on_cache
from sfibench.engine.prefill import Prefilled
from sfibench.engine.workspace import NORM_CHUNK


@torch.no_grad()
def synthetic_prefill(cache: KVCache, context: int, vocab_size: int, num_heads: int, evidence_rows: int = 64,
                      seed: int = 0) -> Prefilled:
    """Draw the cache in place, one (layer, sequence, KV head) block of keys or values at a time (each block
    contiguous, so no scratch copy), then their norms a chunk of keys at a time: the only transient is one
    chunk of float32 keys, whatever the batch and context."""
    with on_cache("prefill", cache):
        return _draw(cache, context, vocab_size, num_heads, evidence_rows, seed)


def _draw(cache: KVCache, context: int, vocab_size: int, num_heads: int, evidence_rows: int,
          seed: int) -> Prefilled:
    layers, batch, kv_heads, _, dim = cache.k.shape
    generator = torch.Generator(device=cache.k.device).manual_seed(seed)
    for layer in range(layers):
        for row in range(batch):
            for head in range(kv_heads):
                for tensor in (cache.k, cache.v):
                    tensor[layer, row, head, :context].normal_(generator=generator)
                for start in range(0, context, NORM_CHUNK):
                    keys = cache.k[layer, row, head, start:min(start + NORM_CHUNK, context)]
                    cache.key_norms[layer, row, head, start:start + keys.shape[0]] = keys.float().norm(dim=-1)
    lengths = torch.full((batch,), context, device=cache.k.device)
    cache.set_lengths(lengths)
    rows = min(evidence_rows, context)
    queries = torch.empty((layers, batch, num_heads, evidence_rows, dim), device=cache.k.device,
                          dtype=cache.k.dtype).normal_(generator=generator)
    logits = torch.randn((batch, vocab_size), generator=generator, device=cache.k.device)
    return Prefilled(lengths, logits, queries, torch.full((batch,), rows, device=cache.k.device))
