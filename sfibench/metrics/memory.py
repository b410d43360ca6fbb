"""Estimate a run's device memory before allocating it, and refuse clearly when it cannot fit.

The estimate is linear in batch B and context S, which lets the error say exactly what would fit:

    total = fixed + B * (per_sequence + S * per_sequence_token)

fixed: weights (every parameter is stored, including an untied embedding table) + method extra;
per_sequence_token: K and V cache + float32 key norms + one prefill chunk's float32 attention scores;
per_sequence: one prefill chunk's activations in one layer + float32 logits for one row.
A method's own state adds `method_token_bytes` per sequence and token and `method_sequence_bytes` per
sequence (see `method_state_bytes` in runners/throughput_measure.py for the optimized SFI's).
"""

from __future__ import annotations

from sfibench.models.presets import ModelConfig

FLOAT32_BYTES = 4
GIB = 1 << 30


class MemoryEstimateError(ValueError):
    """The requested run needs more memory than the device has."""


def estimate_memory(model_cfg: ModelConfig, batch: int, max_seq: int, dtype_bytes: int = 2,
                    method_extra_bytes: int = 0, prefill_chunk: int = 512, method_token_bytes: int = 0,
                    method_sequence_bytes: int = 0) -> dict:
    """Bytes a run needs, by part, plus the linear coefficients `check_fits` solves with.

    The workspace is a rough upper bound: activations are freed layer by layer, so only one layer's
    chunk is live, but the attention scores of a whole chunk are assumed materialised in float32
    (as an eager reference path does); fused attention kernels need much less.
    """
    if batch < 1 or max_seq < 1:
        raise ValueError(f"batch and max_seq must be >= 1, got batch={batch}, max_seq={max_seq}")
    cfg = model_cfg
    weights = cfg.num_params() * dtype_bytes
    kv_per_token = cfg.kv_bytes_per_token(dtype_bytes)
    norms_per_token = cfg.num_layers * cfg.num_kv_heads * FLOAT32_BYTES
    scores_per_token = cfg.num_heads * prefill_chunk * FLOAT32_BYTES
    # residual + normed hidden, q/k/v + attention output, gate/up/activated MLP: one chunk, one layer
    activation_width = (2 * cfg.hidden_size + (2 * cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                        + 3 * cfg.intermediate_size)
    per_sequence = prefill_chunk * activation_width * dtype_bytes + cfg.vocab_size * FLOAT32_BYTES

    fixed = weights + method_extra_bytes
    per_sequence += method_sequence_bytes  # e.g. the optimized SFI's compact K/V buffers
    per_sequence_token = kv_per_token + norms_per_token + scores_per_token + method_token_bytes
    kv_cache = batch * max_seq * kv_per_token
    key_norms = batch * max_seq * norms_per_token
    workspace = batch * (per_sequence + max_seq * scores_per_token)
    total = fixed + batch * (per_sequence + max_seq * per_sequence_token)
    return {
        "batch": batch,
        "max_seq": max_seq,
        "weights": weights,
        "kv_cache": kv_cache,
        "key_norms": key_norms,
        "workspace": workspace,
        "method_extra": method_extra_bytes,
        "total": total,
        "fixed_bytes": fixed,
        "per_sequence_bytes": per_sequence,
        "per_sequence_token_bytes": per_sequence_token,
    }


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def check_fits(estimate: dict, available_bytes: int) -> None:
    """Raise MemoryEstimateError, saying what would fit and how to fix it, if the estimate is too big."""
    if estimate["total"] <= available_bytes:
        return
    batch, max_seq = estimate["batch"], estimate["max_seq"]
    fixed = estimate["fixed_bytes"]
    per_sequence = estimate["per_sequence_bytes"]
    per_token = estimate["per_sequence_token_bytes"]
    asked = (f"batch {batch} x {max_seq} tokens needs about {_gib(estimate['total'])} "
             f"(weights {_gib(estimate['weights'])}, KV cache {_gib(estimate['kv_cache'])}, "
             f"key norms {_gib(estimate['key_norms'])}, workspace {_gib(estimate['workspace'])}, "
             f"method {_gib(estimate['method_extra'])}) but only {_gib(available_bytes)} is available")
    left_for_sequences = available_bytes - fixed

    def largest_context_at(sequences: int) -> int:
        return max(0, (left_for_sequences - sequences * per_sequence) // (sequences * per_token))

    largest_batch = max(0, left_for_sequences // (per_sequence + max_seq * per_token))
    fits = []
    if largest_batch >= 1:
        fits.append(f"batch {largest_batch} at {max_seq} tokens")
    for sequences in sorted({batch, 1}, reverse=True):
        if largest_context_at(sequences) >= 1:
            fits.append(f"{largest_context_at(sequences)} tokens at batch {sequences}")
            break
    if not fits:
        raise MemoryEstimateError(
            f"{asked}; the weights and workspace alone do not fit. Fix: use a smaller model, a smaller "
            "dtype, or a device with more memory.")
    raise MemoryEstimateError(
        f"{asked}. What fits: {' or '.join(fits)}. Fix: lower the batch size or the context (--ctx), "
        "or use a device with more memory.")
