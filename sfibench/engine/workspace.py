"""Device bytes of the transients a method declares through `MethodConfig.workspace_bytes` (the memory
estimate, metrics/memory.py, plans for the largest): the shapes the reference attention primitives
(reference/attention.py, reference/sparse_memory.py) allocate, and the chunk the synthetic prefill
normalises keys in. No torch here: the settings classes that call these load without it.
"""

from __future__ import annotations

# element sizes every byte count of the package uses (scores, key norms and evidence logits are float32;
# positions are int64)
FLOAT32_BYTES = 4
INDEX_BYTES = 8
LENGTH_BUCKET = 256  # graphed steps read up to a multiple of this many slots (the default --length-bucket)
NORM_CHUNK = 8192  # cached keys whose float32 norms a synthetic prefill computes at once (engine/synthetic.py)


def gather_attention_bytes(batch: int, q_heads: int, kv_heads: int, tokens: int, head_dim: int,
                           dtype_bytes: int) -> int:
    """Peak of `attend_fixed_plus_tail` over `tokens` positions per (sequence, KV head): the int64 position
    list and its bool mask, the gathered K and V (with their float32 copies when the cache is narrower), and
    two float32 score rows per query head (the scores and their masked copy, then the softmax)."""
    entries = batch * kv_heads * tokens
    widened = FLOAT32_BYTES if dtype_bytes != FLOAT32_BYTES else 0
    gathered = 2 * entries * head_dim * (dtype_bytes + widened)
    return entries * (INDEX_BYTES + 1) + gathered + 2 * batch * q_heads * tokens * FLOAT32_BYTES


def keys_bytes(batch: int, kv_heads: int, slots: int, head_dim: int, dtype_bytes: int) -> int:
    """`slots` key vectors per (sequence, KV head) of one layer: the size of a copy of a layer's keys."""
    return batch * kv_heads * slots * head_dim * dtype_bytes


def round_up(length: int, bucket: int) -> int:
    """`length` rounded up to a multiple of `bucket`: the static size a step's kernel is given
    (StepContext.bucketed)."""
    return -(-length // bucket) * bucket


def bucketed_slots(length: int, max_seq: int) -> int:
    """The most slots a graphed step with the default length bucket sizes a read of at most `length` slots
    to, in a cache of `max_seq`."""
    return round_up(min(length, max_seq), LENGTH_BUCKET)
