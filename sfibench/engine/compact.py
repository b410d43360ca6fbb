"""Compact caches: a method that reads only part of each prompt keeps only that part.

A method whose settings declare `compact_slots(path)` (the prompt slots it reads at most after the prompt,
whatever the prompt's length) never looks at the rest of the prompt again. The engine honours that: each
prompt is prefilled alone into a cache of one sequence, the method chooses what it keeps of it
(`AttentionMethod.keep`: fixed positions per layer and KV head, and where a contiguous tail of the prompt
starts), those keys and values are copied into the compact cache, and the one-sequence cache is reused for
the next prompt and freed after the last. At its peak the run holds the compact cache of the whole batch
and one prompt's full cache.

A compact sequence's slots are its fixed positions, then the prompt's tail and every generated token
(engine/cache.py: `fixed_rows`, `position_offset`). Keys keep the RoPE of their original positions, and the
step driver rotates each new query and key at its original position.

Models with sliding-window layers keep the whole cache: a local layer reads the last slots as its window.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.method import AttentionMethod
from sfibench.engine.prefill import Prefilled
from sfibench.models.presets import ModelConfig


def compact_slots(config, path: str, model_config: ModelConfig, max_seq: int, room: int) -> int | None:
    """Slots per sequence of the compact cache a method with settings `config` on `path` decodes from, where
    the whole cache would be `max_seq` slots with `room` of them left after the longest prompt (None: the
    method reads the whole cache)."""
    kept = config.compact_slots(path)
    if kept is None or model_config.sliding_window:
        return None
    return min(max_seq, kept + room)


def uses_compact_cache(config, path: str, model_config: ModelConfig) -> bool:
    return compact_slots(config, path, model_config, 1, 0) is not None


@torch.no_grad()
def compact_prefill(method: AttentionMethod, slots: int, lengths: list[int], device, dtype: torch.dtype,
                    fill: Callable[[KVCache, int], Prefilled]) -> tuple[KVCache, Prefilled]:
    """The compact cache, `slots` per sequence (compact_slots), of sequences whose prompts are `lengths`
    tokens, and its snapshot. `fill(prompt_cache, row)` prefills prompt `row` into a one-sequence cache (really or
    synthetically) and returns its snapshot. The returned snapshot's lengths are the compact cache's; it
    keeps each prompt's last logits and no prompt queries (the choice that needed them is made)."""
    mc, batch = method.model_config, len(lengths)
    compact = KVCache(mc, batch, slots, device, dtype)
    compact.position_offset = torch.zeros(batch, dtype=torch.long, device=device)
    compact.fixed_rows = torch.zeros(batch, dtype=torch.long, device=device)
    prompt_cache = KVCache(mc, 1, max(lengths), device, dtype)  # the only full-length cache, one prompt's
    last_logits, compact_lengths = [], []
    for row, length in enumerate(lengths):
        snapshot = fill(prompt_cache, row)
        fixed, tail_start = method.keep(prompt_cache, snapshot, 0)
        compact_lengths.append(copy_kept(prompt_cache, compact, row, fixed, tail_start, length))
        compact.position_offset[row] = tail_start - fixed.shape[-1]
        compact.fixed_rows[row] = fixed.shape[-1]
        last_logits.append(snapshot.last_logits[0])
        del snapshot
    del prompt_cache
    counts = torch.tensor(compact_lengths, device=device)
    compact.set_lengths(counts)
    queries = torch.zeros(mc.num_layers, batch, mc.num_heads, 0, mc.head_dim, device=device, dtype=dtype)
    return compact, Prefilled(counts, torch.stack(last_logits), queries, torch.zeros_like(counts))


def copy_kept(source: KVCache, compact: KVCache, row: int, fixed: torch.Tensor, tail_start: int,
              length: int) -> int:
    """Copy sequence 0 of `source` (a `length`-token prompt) into row `row` of `compact`: the positions
    `fixed [layers, H_kv, F]`, then the prompt from `tail_start` on. Returns the slots filled. One layer at a
    time, so the gathered copy beside the caches is one layer's fixed rows."""
    count, tail = fixed.shape[-1], length - tail_start
    if count + tail > compact.max_seq:
        raise ValueError(f"the method keeps {count + tail} slots of a {length}-token prompt, more than the "
                         f"{compact.max_seq} its compact_slots declared")
    for layer in range(source.config.num_layers):
        index = fixed[layer]  # [H_kv, F]
        for whole, part in ((source.k, compact.k), (source.v, compact.v)):
            rows = whole[layer, 0].gather(1, index[..., None].expand(-1, -1, whole.shape[-1]))
            part[layer, row, :, :count] = rows
            part[layer, row, :, count:count + tail] = whole[layer, 0, :, tail_start:length]
        compact.key_norms[layer, row, :, :count] = source.key_norms[layer, 0].gather(1, index)
        compact.key_norms[layer, row, :, count:count + tail] = source.key_norms[layer, 0, :, tail_start:length]
    return count + tail

