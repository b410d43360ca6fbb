"""How many bytes one decode step must move, and the roofline ratio SFI can reach (SPEC section 7).

Decode is memory-bound: each step streams the weights once for the whole batch and, per sequence,
the K and V tokens attention reads. Everything here counts bytes moved between device memory and the
chip, assuming each byte is touched once (perfect caching within a step, no re-reads).

What counts as a weight read per step:
- every decoder-layer matrix, bias and norm, and the final norm: read once;
- the LM head: the full vocab x hidden matrix, read once whether or not it is tied to the embedding;
- the input embedding: NOT read in full. Decode gathers one row per sequence, counted separately as
  per-sequence traffic (`embedding_gather_bytes`). With untied embeddings the rest of the table is
  never touched, so it is excluded from `weight_bytes`; with tied ones the same matrix is the LM
  head and is counted once, as the LM head.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sfibench.config import SFIConfig
from sfibench.models.presets import ModelConfig
from sfibench.sfi import geometry

FLOAT32_BYTES = 4  # evidence logits and cached key norms are kept in float32
INDEX_BYTES = 8  # selected positions are stored as int64


def weight_bytes(model_cfg: ModelConfig, dtype_bytes: int = 2) -> int:
    """Weight bytes read once per decode step, independent of batch (see module docstring)."""
    params_read = model_cfg.num_params()
    if not model_cfg.tie_word_embeddings:
        # num_params() counts an untied embedding table; decode only gathers rows from it.
        params_read -= model_cfg.vocab_size * model_cfg.hidden_size
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


def refresh_bytes(model_cfg: ModelConfig, candidates, k_head: int, batch: int, dtype_bytes: int = 2,
                  evidence_rows: int | None = None, layers_refreshed: float | None = None,
                  path: str = "optimized") -> float:
    """Extra traffic of an SFI refresh beyond the slow step's dense attention read (which `kv_read_bytes`
    counts), as each path actually moves it.

    Per refreshed (layer, sequence, KV head), with C = `candidates`, K = min(k_head, C),
    R = `evidence_rows` (default G query heads x 1 decode row), D = head_dim, b = dtype_bytes:

        evidence   2 * R * C * 4   float32 logits over C written once, read by the Selector
        norms          C * 4       the Selector reads the cached float32 key norms over C
        selection      K * 8       the Selector writes the int64 selected positions
      optimized:
        rebuild    2 * K * 2*D*b   gather the K selected K and V rows and write them contiguous (compact buffer);
                                   the dense kernel wrote the evidence in the same pass that read K
      reference:
        second K read  C * D * b   the logits are recomputed from the kept query and K over C after the
                                   step (no compact buffer: fast steps gather through the position list)

    This is the minimum for each path's algorithm (the Selector's internal stages assumed fused).
    `candidates` is a scalar (same for every sequence) or one value per sequence. Only global layers
    refresh (a sliding-window layer has no selection): `layers_refreshed` defaults to all of them, and
    fewer models `layer_groups` = 2.
    """
    if path not in ("optimized", "reference"):
        raise ValueError(f"unknown path {path!r}; valid: optimized, reference")
    if hasattr(candidates, "detach"):
        candidates = candidates.detach().cpu().numpy()
    per_sequence = np.broadcast_to(np.asarray(candidates, dtype=np.float64), (batch,))
    if (per_sequence < 0).any():
        raise ValueError("candidates must be non-negative")
    selected = np.minimum(per_sequence, k_head)
    rows = model_cfg.group_size if evidence_rows is None else evidence_rows
    layers = len(model_cfg.global_layers) if layers_refreshed is None else layers_refreshed
    evidence = 2 * rows * per_sequence * FLOAT32_BYTES
    norms = per_sequence * FLOAT32_BYTES
    selection = selected * INDEX_BYTES
    if path == "optimized":
        moved = 2 * selected * 2 * model_cfg.head_dim * dtype_bytes
    else:
        moved = per_sequence * model_cfg.head_dim * dtype_bytes
    per_layer_head = evidence + norms + selection + moved
    return float(per_layer_head.sum()) * layers * model_cfg.num_kv_heads


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step moves, by source."""

    weights: float
    kv_read: float
    kv_append: float
    embedding_gather: float
    refresh: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_read + self.kv_append + self.embedding_gather + self.refresh

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def step_bytes(model_cfg: ModelConfig, tokens_read, batch: int, dtype_bytes: int = 2,
               refresh: float = 0.0) -> StepBytes:
    """All bytes of one decode step; pass `refresh` = `refresh_bytes(...)` on SFI slow steps."""
    return StepBytes(
        weights=float(weight_bytes(model_cfg, dtype_bytes)),
        kv_read=kv_read_bytes(model_cfg, tokens_read, batch, dtype_bytes),
        kv_append=float(kv_append_bytes(model_cfg, batch, dtype_bytes)),
        embedding_gather=float(embedding_gather_bytes(model_cfg, batch, dtype_bytes)),
        refresh=float(refresh),
    )


def sfi_candidates(context_len: int, sfi: SFIConfig) -> int:
    """|C| at a refresh (see sfibench.sfi.geometry)."""
    return geometry.candidates(context_len, sfi)


def sfi_tokens_read(context_len: int, sfi: SFIConfig) -> int:
    """Tokens a fast step reads per (layer, KV head) right after a refresh (see sfibench.sfi.geometry)."""
    return geometry.tokens_read_after_refresh(context_len, sfi)


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


def roofline_seconds(nbytes: float, bandwidth: float) -> float:
    """Time the step would take if it moved `nbytes` at `bandwidth` bytes/s."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    return nbytes / bandwidth


def achieved_bandwidth(nbytes: float, seconds: float) -> float:
    """Bytes per second a measured step achieved."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return nbytes / seconds


def efficiency(roofline_seconds: float, measured_seconds: float) -> float:
    """Fraction of the roofline reached: 1.0 means the step ran at the measured copy bandwidth."""
    if measured_seconds <= 0:
        raise ValueError(f"measured_seconds must be positive, got {measured_seconds}")
    return roofline_seconds / measured_seconds
