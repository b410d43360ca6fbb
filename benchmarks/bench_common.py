"""What every CUDA kernel benchmark here does around its measurements: refuse to run where no GPU is visible,
time a call in rounds, and write its rows beside the provenance of the tree that ran."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from sfibench.core.provenance import provenance
from sfibench.metrics.timing import time_region


def cuda_visible(script: str, hint: str = "") -> bool:
    """True when a CUDA device is visible; otherwise one line on stderr says nothing was measured."""
    if torch.cuda.is_available():
        return True
    print(f"{script} times CUDA kernels and no CUDA device is visible here; nothing measured.{hint}",
          file=sys.stderr)
    return False


def time_ms(fn, repeats: int = 5, calls: int = 20) -> list[float]:
    """Per-call milliseconds of `fn` on the GPU (metrics/timing.time_region's CUDA events, one untimed call
    first), the median of `calls` calls per repeat, for each repeat."""
    return [statistics.median(time_region(fn, "cuda", warmup=1, repeats=calls)) * 1e3 for _ in range(repeats)]


def write_rows(out: Path | None, payload: dict) -> None:
    """Write `payload` after the run's provenance (commit, device, versions) as JSON to `out`, if given."""
    if out is None:
        return
    out.write_text(json.dumps({"provenance": provenance(), **payload}, indent=2) + "\n")
    print(f"wrote {out}")
