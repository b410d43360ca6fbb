"""What an SFI refresh moves beyond the slow step's dense read, as each path moves it (SPEC section 7)."""

from __future__ import annotations

from sfibench.engine.workspace import FLOAT32_BYTES, INDEX_BYTES
from sfibench.models.presets import ModelConfig


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
    import numpy as np  # here: sfi/config.py imports this module, and the command line imports it first thing

    if hasattr(candidates, "detach"):
        candidates = candidates.detach().cpu().numpy()
    per_sequence = np.broadcast_to(np.asarray(candidates, dtype=np.float64), (batch,))
    if (per_sequence < 0).any():
        raise ValueError("candidates must be non-negative")
    selected = np.minimum(per_sequence, k_head)
    rows = model_cfg.group_size if evidence_rows is None else evidence_rows
    layers = len(model_cfg.global_layers) if layers_refreshed is None else layers_refreshed
    evidence = 2 * rows * per_sequence * FLOAT32_BYTES  # evidence logits and key norms are float32
    norms = per_sequence * FLOAT32_BYTES
    selection = selected * INDEX_BYTES  # selected positions are int64
    if path == "optimized":
        moved = 2 * selected * 2 * model_cfg.head_dim * dtype_bytes
    else:
        moved = per_sequence * model_cfg.head_dim * dtype_bytes
    per_layer_head = evidence + norms + selection + moved
    return float(per_layer_head.sum()) * layers * model_cfg.num_kv_heads
