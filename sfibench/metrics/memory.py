"""Estimate a run's device memory before allocating it, size `--batch max` by it, and refuse clearly.

The estimate counts what a decode run allocates, part by part:

- weights: every parameter once (the norm folds rewrite weights in place), plus the RoPE position table
  the GPU decode path gathers from;
- the KV cache, its float32 key norms, and the prefill snapshot (the last prompt queries every method's
  bootstrap reads, float32 logits of the last prompt token);
- the method's own state (MethodConfig.state_bytes: compact buffers, evidence, page bounds), for the
  largest method of the run, as one method runs at a time;
- the workspace, the largest of the phases' transients: prefill's (a real prefill runs one sequence and
  one chunk at a time; a synthetic one writes the cache in place, one (layer, sequence, KV head) at a
  time, with one chunk of float32 key norms) and the decode phase's (the method's bootstrap and refresh
  transients, MethodConfig.workspace_bytes, and the decode step's own, which CUDA graphs keep in their
  pool: one float32 logits row per sequence for each captured plan).

The total is the larger phase: the prefill's transients, or the method's state with the decode phase's
(the state is allocated when the method starts, after the prefill).

A method that keeps only part of each prompt (MethodConfig.compact_slots; engine/compact.py) holds a compact
cache of `compact_slots` slots per sequence instead, its key norms and each prompt's last logits; while the
prompts are prefilled, one at a time, one prompt's whole cache and snapshot come on top, with the larger of
that prefill's transients and the method's choice (its workspace at one sequence, the positions it keeps
and one layer's copy of their keys). Its largest batch is its own, not the whole cache's.

A run plans with MARGIN of the device's memory: the rest is the CUDA context, cuBLAS and Triton's
workspaces and the caching allocator's fragmentation, none of which torch's allocator counts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sfibench.engine.workspace import FLOAT32_BYTES, INDEX_BYTES, NORM_CHUNK
from sfibench.models.presets import ModelConfig

GIB = 1 << 30
MARGIN = 0.95  # share of the device's memory a run may plan to fill
PREFILL_CHUNK = 2048  # prompt tokens a real prefill runs at once (engine/prefill.py)
EVIDENCE_ROWS = 64  # prompt queries the prefill snapshot keeps per layer and query head
GRAPH_PLANS = 8  # captured step plans whose logits a CUDA-graph pool holds (a bound, from the plans seen)


class MemoryEstimateError(ValueError):
    """The requested run needs more memory than the device has."""


@dataclass(frozen=True)
class RunShape:
    """What the estimate depends on besides the model: the shape and the run's choices."""

    batch: int
    max_seq: int  # cache slots per sequence (context + decode steps + 1)
    dtype_bytes: int = 2
    method_token_bytes: int = 0  # the method's state per sequence and cached token
    method_sequence_bytes: int = 0  # ... and per sequence
    method_workspace_bytes: int = 0  # the method's largest transient, at this batch and context
    synthetic_prefill: bool = True  # False: the prompt runs through the model (engine/prefill.py)
    steps: int = 0  # decode steps: the prompt is max_seq - steps - 1 tokens (0: as long as the cache allows)
    gpu: bool = False  # the RoPE table and the CUDA graphs' pool exist only on a GPU
    compact_slots: int = 0  # slots per sequence of a compact cache (engine/compact.py); 0: the whole cache


def prompt_tokens(max_seq: int, steps: int) -> int:
    """The prompt of a run of `max_seq` cache slots decoding `steps` tokens (the last slot holds the token
    the last step samples)."""
    return max(max_seq - steps - 1, 1)


def prefill_workspace(cfg: ModelConfig, shape: RunShape) -> int:
    """The prefill's largest transient. Synthetic: the float32 norms of one chunk of one KV head's keys,
    and those keys widened to float32 when the cache is narrower. Real (engine/prefill.py, one chunk of one
    sequence at a time): the largest of a chunk layer's two peaks, beside the RoPE tables and the last
    token's float32 logits (see `chunk_peak`)."""
    if shape.synthetic_prefill:
        widened = cfg.head_dim if shape.dtype_bytes != FLOAT32_BYTES else 0
        return min(NORM_CHUNK, shape.max_seq) * (widened + 1) * FLOAT32_BYTES
    prompt = prompt_tokens(shape.max_seq, shape.steps)
    full, rest = divmod(prompt, PREFILL_CHUNK)
    # the chunks whose peaks differ: the first, the last whole one (the widest mask of whole chunks) and
    # the shorter last one (against the whole prompt)
    chunks = {(min(PREFILL_CHUNK, prompt), 0)}
    if full >= 2:
        chunks.add((PREFILL_CHUNK, (full - 1) * PREFILL_CHUNK))
    if full >= 1 and rest:
        chunks.add((rest, full * PREFILL_CHUNK))
    tables = (2 if cfg.sliding_window else 1) * 2 * min(PREFILL_CHUNK, prompt) * cfg.head_dim * shape.dtype_bytes
    return max(chunk_peak(cfg, tokens, start, shape.dtype_bytes) for tokens, start in chunks) + tables \
        + cfg.vocab_size * FLOAT32_BYTES


def chunk_peak(cfg: ModelConfig, tokens: int, start: int, dtype_bytes: int) -> int:
    """The larger of one layer's two peaks on a prefill chunk of `tokens` queries at positions from `start`:

    - attention: the embeddings (held for the whole forward), the stream and its norm entering the layer,
      the qkv product, the rotated q and k (and Gemma's rescaled q), the attention output, and the chunk's
      additive mask (engine/sliding.additive_mask): against every key so far on a global layer after the
      first chunk (which is causal without one), two bands of the chunk and its window while one is built
      on a sliding layer;
    - MLP: five rows of the stream (the embeddings, the stream and its norm entering and leaving the
      attention block), the attention output, and the gate/up product beside its activation and their
      product.

    Counted in the model's dtype; in a narrower one than float32 the attention kernel's own float32 buffers
    (on a CPU, a score block per thread and the output's accumulators) come on top."""
    h, q_width, kv_width = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    scaled_q = q_width if (cfg.query_pre_attn_scalar or cfg.head_dim) != cfg.head_dim else 0
    rows = 3 * h + (q_width + 2 * kv_width) + (q_width + kv_width) + scaled_q + q_width
    mask = 0
    if start and cfg.global_layers:
        mask = tokens * (start + tokens)
    if cfg.sliding_window:
        mask = max(mask, 2 * tokens * (tokens + min(cfg.sliding_window - 1, start)))
    mlp = tokens * (5 * h + q_width + 4 * cfg.intermediate_size)
    return max(tokens * rows + mask, mlp) * dtype_bytes


def estimate_memory(model_cfg: ModelConfig, batch: int, max_seq: int, dtype_bytes: int = 2, **choices) -> dict:
    """Bytes a run of `batch` sequences of `max_seq` cache slots allocates, by part (see the module
    docstring); `choices` are RunShape's other fields. The dict keeps the shape, so `check_fits` and
    `largest_batch` can ask again at other shapes."""
    if batch < 1 or max_seq < 1:
        raise ValueError(f"batch and max_seq must be >= 1, got batch={batch}, max_seq={max_seq}")
    shape = RunShape(batch, max_seq, dtype_bytes, **choices)
    return _estimate(model_cfg, shape)


def _estimate(cfg: ModelConfig, shape: RunShape) -> dict:
    batch, slots, nbytes = shape.batch, shape.max_seq, shape.dtype_bytes
    rope_table = cfg.max_context * 2 * cfg.head_dim * nbytes if shape.gpu else 0
    weights = cfg.num_params() * nbytes + rope_table
    held = shape.compact_slots or slots  # cache slots per sequence while decoding
    kv_cache = batch * held * cfg.kv_bytes_per_token(nbytes)
    key_norms = batch * held * cfg.num_layers * cfg.num_kv_heads * FLOAT32_BYTES
    evidence = cfg.num_layers * cfg.num_heads * EVIDENCE_ROWS * cfg.head_dim * nbytes  # one sequence's queries
    snapshot = batch * (evidence + cfg.vocab_size * FLOAT32_BYTES)
    method_state = batch * (held * shape.method_token_bytes + shape.method_sequence_bytes)
    step = batch * cfg.vocab_size * FLOAT32_BYTES * (GRAPH_PLANS if shape.gpu else 1)
    prefill, decode = prefill_workspace(cfg, shape), shape.method_workspace_bytes + step
    prompt_cache = 0
    if shape.compact_slots:
        snapshot = batch * cfg.vocab_size * FLOAT32_BYTES  # the last logits; the prompt queries were used up
        prompt = prompt_tokens(slots, shape.steps)
        prompt_cache = prompt * (cfg.kv_bytes_per_token(nbytes) + cfg.num_layers * cfg.num_kv_heads * FLOAT32_BYTES)
        kept = max(shape.compact_slots - (slots - prompt), 0)  # prompt slots kept per sequence at most
        choice = shape.method_workspace_bytes + kept * cfg.num_kv_heads * (
            cfg.num_layers * INDEX_BYTES + 2 * cfg.head_dim * nbytes)
        prefill = prompt_cache + evidence + cfg.vocab_size * FLOAT32_BYTES + max(prefill, choice)
        decode = step
    workspace = max(prefill, decode)
    # the method's state is allocated when its decode starts, after the prefill's transients are gone
    total = weights + kv_cache + key_norms + snapshot + max(prefill, method_state + decode)
    return {"batch": batch, "max_seq": slots, "weights": weights, "kv_cache": kv_cache, "key_norms": key_norms,
            "prompt_cache": prompt_cache, "snapshot": snapshot, "method_state": method_state, "workspace": workspace,
            "prefill_workspace": prefill, "decode_workspace": decode, "total": total,
            "decode_total": weights + kv_cache + key_norms + snapshot + method_state + decode, "shape": shape,
            "model": cfg}


def memory_record(estimate: dict) -> dict:
    """The estimate as results.json keeps it: bytes by part."""
    return {key: value for key, value in estimate.items() if key not in ("shape", "model")}


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def _fits(estimate: dict, batch: int, max_seq: int, available: int, method_at=None) -> bool:
    shape = replace(estimate["shape"], batch=batch, max_seq=max_seq)
    if method_at is not None:
        shape = replace(shape, **method_at(batch, max_seq))
    return _estimate(estimate["model"], shape)["total"] <= available


def largest_batch(estimate: dict, available: int, method_at=None) -> int:
    """The largest batch at the estimate's `max_seq` that fits in `available` bytes (0: not even one).
    `method_at(batch, max_seq)`: the method fields of RunShape at another shape (the run's largest method
    may differ by shape; default: the estimate's)."""
    if not _fits(estimate, 1, estimate["max_seq"], available, method_at):
        return 0
    low, high = 1, 2
    while _fits(estimate, high, estimate["max_seq"], available, method_at):
        low, high = high, high * 2
    while high - low > 1:  # the total grows with the batch: bisect between a fit and a miss
        middle = (low + high) // 2
        low, high = (middle, high) if _fits(estimate, middle, estimate["max_seq"], available, method_at) \
            else (low, middle)
    return low


def largest_context(estimate: dict, batch: int, available: int, method_at=None) -> int:
    """The most cache slots per sequence at `batch` that fit in `available` bytes (0: none)."""
    if not _fits(estimate, batch, 1, available, method_at):
        return 0
    low, high = 1, estimate["max_seq"]
    if _fits(estimate, batch, high, available, method_at):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _fits(estimate, batch, middle, available, method_at) else (low, middle)
    return low


def check_fits(estimate: dict, available_bytes: int, method_at=None) -> None:
    """Raise MemoryEstimateError, saying what would fit and how to fix it, if the estimate is too big."""
    if estimate["total"] <= available_bytes:
        return
    batch, max_seq = estimate["batch"], estimate["max_seq"]
    asked = (f"batch {batch:,} x {max_seq:,} tokens needs about {_gib(estimate['total'])} "
             f"(weights {_gib(estimate['weights'])}, KV cache {_gib(estimate['kv_cache'])}, "
             f"key norms {_gib(estimate['key_norms'])}, method state {_gib(estimate['method_state'])}, "
             f"workspace {_gib(estimate['workspace'])}) but only {_gib(available_bytes)} is available")
    fits = []
    sequences = largest_batch(estimate, available_bytes, method_at)
    if sequences >= 1:
        fits.append(f"batch {sequences:,} at {max_seq:,} tokens")
    for sequences in sorted({batch, 1}, reverse=True):
        slots = largest_context(estimate, sequences, available_bytes, method_at)
        if slots >= 1:
            fits.append(f"{slots:,} tokens at batch {sequences:,}")
            break
    if not fits:
        raise MemoryEstimateError(
            f"{asked}; the weights and workspace alone do not fit. Fix: use a smaller model, a smaller "
            "dtype, or a device with more memory.")
    raise MemoryEstimateError(
        f"{asked}. What fits: {' or '.join(fits)}. Fix: lower the batch size or the context (--ctx), "
        "or use a device with more memory.")


def planning_bytes(total_bytes: int, usable_bytes: int) -> int:
    """What a run may plan to fill: MARGIN of the device's memory, and never more than this process can
    use (`usable_bytes`: free memory plus what torch already holds, weights included)."""
    return min(int(MARGIN * total_bytes), usable_bytes)
