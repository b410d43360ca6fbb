"""How many bytes one decode step must move, and the roofline ratio SFI can reach (SPEC section 7).

Decode is memory-bound: each step streams the weights once for the whole batch and, per sequence,
the K and V tokens attention reads. Everything here counts bytes moved between device memory and the
chip, assuming each byte is touched once (perfect caching within a step, no re-reads).

What counts as a weight read per step:
- every decoder-layer matrix, bias and norm, and the final norm: read once;
- the LM head: the full vocab x hidden matrix, read once whether or not it is tied to the embedding (a
  tensor-parallel rank's shape, ModelConfig.rank_share: its 1/ranks of the vocabulary rows);
- the input embedding: NOT read in full. Decode gathers one row per sequence, counted separately as
  per-sequence traffic (`embedding_gather_bytes`). With untied embeddings the rest of the table is
  never touched, so it is excluded from `weight_bytes`; with tied ones the same matrix is the LM
  head and is counted once, as the LM head.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sfibench.engine.workspace import FLOAT32_BYTES
from sfibench.models.presets import ModelConfig


def weight_bytes(model_cfg: ModelConfig, dtype_bytes: int = 2) -> int:
    """Weight bytes read once per decode step, independent of batch (see module docstring)."""
    table = model_cfg.vocab_size * model_cfg.hidden_size
    params_read = model_cfg.num_params() - table  # the embedding table: decode only gathers rows from it
    if model_cfg.tie_word_embeddings:  # ... unless it is the LM head: a tensor-parallel rank reads its vocabulary
        params_read += -(-model_cfg.vocab_size // model_cfg.ranks) * model_cfg.hidden_size
    return params_read * dtype_bytes


def embedding_gather_bytes(model_cfg: ModelConfig, batch: int, dtype_bytes: int = 2) -> int:
    """The one embedding row per sequence that decode gathers for its input token."""
    return batch * model_cfg.hidden_size * dtype_bytes


def _per_layer_head_sequence(values, model_cfg: ModelConfig, batch: int, what: str) -> np.ndarray:
    """Broadcast a count to shape [layers, batch, kv_heads] (the cache layout).

    Accepts a scalar (same everywhere), [layers, kv_heads] (same for every sequence) or
    [layers, batch, kv_heads] (per sequence). Torch tensors are accepted too.
    """
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    counts = np.asarray(values, dtype=np.float64)
    layers, heads = model_cfg.num_layers, model_cfg.num_kv_heads
    if counts.ndim == 2:
        if counts.shape != (layers, heads):
            raise ValueError(f"{what} of shape {counts.shape} should be [layers, kv_heads] = "
                             f"[{layers}, {heads}]")
        counts = counts[:, None, :]
    elif counts.ndim == 3 and counts.shape != (layers, batch, heads):
        raise ValueError(f"{what} of shape {counts.shape} should be [layers, batch, kv_heads] = "
                         f"[{layers}, {batch}, {heads}]")
    elif counts.ndim not in (0, 3):
        raise ValueError(f"{what} must be a scalar, [layers, kv_heads] or [layers, batch, kv_heads]")
    if (counts < 0).any():
        raise ValueError(f"{what} must be non-negative")
    return np.broadcast_to(counts, (layers, batch, heads))


def kv_read_bytes(model_cfg: ModelConfig, tokens_read, batch: int, dtype_bytes: int = 2) -> float:
    """K and V bytes attention reads in one step: sum of tokens read x 2 (K, V) x head_dim x dtype.

    `tokens_read` is per (layer, KV head) per sequence: a scalar, [layers, kv_heads] or
    [layers, batch, kv_heads]; it may be fractional (a mean over steps).
    """
    tokens = _per_layer_head_sequence(tokens_read, model_cfg, batch, "tokens_read")
    return float(tokens.sum()) * 2 * model_cfg.head_dim * dtype_bytes


def kv_append_bytes(model_cfg: ModelConfig, batch: int, dtype_bytes: int = 2) -> int:
    """Writing the new token's K, V and float32 key norm (the engine caches norms) to every layer."""
    per_layer_head = 2 * model_cfg.head_dim * dtype_bytes + FLOAT32_BYTES
    return batch * model_cfg.num_layers * model_cfg.num_kv_heads * per_layer_head


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step moves, by source."""

    weights: float
    kv_read: float
    kv_append: float
    embedding_gather: float
    refresh: float
    method: float = 0.0  # what the method reads beside K/V every step (MethodConfig.step_bytes)

    @property
    def total(self) -> float:
        return self.weights + self.kv_read + self.kv_append + self.embedding_gather + self.refresh + self.method

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def step_bytes(model_cfg: ModelConfig, tokens_read, batch: int, dtype_bytes: int = 2,
               refresh: float = 0.0, method: float = 0.0) -> StepBytes:
    """All bytes of one decode step; `refresh` is a refreshing method's extra traffic on its slow steps
    (MethodConfig.refresh_bytes), `method` what the method reads beside K/V every step."""
    return StepBytes(
        weights=float(weight_bytes(model_cfg, dtype_bytes)),
        kv_read=kv_read_bytes(model_cfg, tokens_read, batch, dtype_bytes),
        kv_append=float(kv_append_bytes(model_cfg, batch, dtype_bytes)),
        embedding_gather=float(embedding_gather_bytes(model_cfg, batch, dtype_bytes)),
        refresh=float(refresh),
        method=float(method),
    )


def roofline_ratio(W: float, kv_full: float, kv_sparse: float, batch: int, n_slow: float) -> float:
    """Best SFI / Full-KV throughput ratio the byte roofline allows (SPEC section 7):

        (W + B * KV_full) / (W + B * KV_sparse + (W + B * KV_full) / N_slow)

    W: weight bytes per step; KV_full / KV_sparse: K+V bytes one sequence reads per step densely /
    on a fast step; N_slow: mean interval in steps between slow steps (inf when none happen).
    """
    if n_slow <= 0:
        raise ValueError(f"n_slow is the mean interval between slow steps and must be > 0, got {n_slow}")
    dense = W + batch * kv_full
    slow_share = 0.0 if math.isinf(n_slow) else dense / n_slow
    return dense / (W + batch * kv_sparse + slow_share)
