"""Prefill: run each prompt through the model in chunks, filling the cache with dense causal attention
(over the window only, on a sliding-window layer).

Prefill is the same for every method, so it is done once and shared. Besides the cache it keeps the
last `evidence_rows` prompt queries of every layer: SFI's bootstrap refresh and SnapKV's one-shot
selection both score prompt positions with them. Because the cache is append-only, restoring a
`Prefilled` snapshot for another method only resets the lengths; no KV is copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sfibench.engine.cache import KVCache
from sfibench.engine.memory_phases import on_cache
from sfibench.engine.sliding import additive_mask, window_prefill_attention
from sfibench.models.decoder import Decoder


@dataclass
class Prefilled:
    lengths: torch.Tensor  # [B] prompt lengths
    last_logits: torch.Tensor  # [B, V] logits after each prompt's last token
    queries: torch.Tensor  # [L, B, H_q, W, D] the last W prompt queries (post-RoPE), left-aligned
    query_counts: torch.Tensor  # [B] how many of the W rows are real (short prompts have fewer)

    def query_positions(self, row: int) -> torch.Tensor:
        """Positions of the stored query rows of sequence `row`."""
        count, length = int(self.query_counts[row]), int(self.lengths[row])
        return torch.arange(length - count, length)


def causal_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Queries at positions [start, start + T) over keys [0, start + T) with a causal mask."""
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    visible = additive_mask(q.shape[2], k.shape[2], start, None, q.dtype, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)


class PromptError(ValueError):
    pass


def check_prompts(prompts: list[list[int]], max_tokens: int, max_new_tokens: int) -> None:
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise PromptError(f"prompt {index} is empty; give at least one token of text")
        if len(prompt) + max_new_tokens > max_tokens:
            raise PromptError(
                f"prompt {index} has {len(prompt):,} tokens; with {max_new_tokens:,} new tokens that exceeds the "
                f"limit of {max_tokens:,} tokens (model context / cache size); shorten the prompt or ask for "
                "fewer new tokens"
            )


@torch.no_grad()
def prefill(model: Decoder, cache: KVCache, prompts: list[list[int]], chunk: int = 2048,
            evidence_rows: int = 64) -> Prefilled:
    with on_cache("prefill", cache):
        return _prefill(model, cache, prompts, chunk, evidence_rows)


def evidence_buffers(cache: KVCache, lengths: list[int], evidence_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Room for the last `evidence_rows` prompt queries of every layer and sequence (Prefilled.queries), and how
    many of them each sequence has (Prefilled.query_counts)."""
    cfg, device = cache.config, cache.k.device
    queries = torch.zeros(cfg.num_layers, cache.batch, cfg.num_heads, evidence_rows, cfg.head_dim,
                          device=device, dtype=cache.k.dtype)
    return queries, torch.tensor([min(length, evidence_rows) for length in lengths], device=device)


def prefill_layer(cache: KVCache, queries: torch.Tensor, counts: torch.Tensor, length: int, layer: int, row: int,
                  start: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One layer of a prefill chunk of sequence `row` (a prompt of `length` tokens): positions
    [start, start + T) with q `[1, H_q, T, D]` and k, v `[1, H_kv, T, D]`.

    Appends k/v to the cache, keeps the queries among the prompt's last `counts[row]`, and attends causally
    over the cache (over the window only, on a sliding-window layer)."""
    cfg = cache.config
    end = start + k.shape[2]
    cache.write_chunk(layer, row, start, k[0], v[0])
    first_kept = length - int(counts[row])  # first prompt position whose query is kept
    keep_from = max(first_kept, start)
    if keep_from < end:
        queries[layer, row, :, keep_from - first_kept:end - first_kept] = q[0, :, keep_from - start:]
    k_all = cache.k[layer, row:row + 1, :, :end]
    v_all = cache.v[layer, row:row + 1, :, :end]
    if not cfg.is_global(layer):
        return window_prefill_attention(q, k_all, v_all, start, cfg.sliding_window)
    return causal_prefill_attention(q, k_all, v_all, start)


def _prefill(model: Decoder, cache: KVCache, prompts: list[list[int]], chunk: int, evidence_rows: int) -> Prefilled:
    device = cache.k.device
    queries, counts = evidence_buffers(cache, [len(p) for p in prompts], evidence_rows)
    last_logits = []
    for row, prompt in enumerate(prompts):
        length = len(prompt)
        tokens = torch.tensor(prompt, device=device)
        for start in range(0, length, chunk):
            end = min(start + chunk, length)

            def attend(layer, q, k, v, start=start, row=row, length=length):
                return prefill_layer(cache, queries, counts, length, layer, row, start, q, k, v)

            logits = model(tokens[None, start:end], torch.arange(start, end, device=device)[None], attend,
                           last_only=True)
        last_logits.append(logits[0, -1])
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    cache.set_lengths(lengths)
    return Prefilled(lengths, torch.stack(last_logits), queries, counts)


def restore(cache: KVCache, prefilled: Prefilled) -> None:
    """Rewind the cache to the prefilled prompts (decode only ever wrote past them)."""
    cache.set_lengths(prefilled.lengths)
