"""Summary statistics for timing samples: latency percentiles and run-to-run spread.

Percentiles use numpy's default linear interpolation between order statistics, so results match
`np.percentile` and are reproducible by hand on small samples.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def _as_sample(values: Iterable[float], what: str) -> np.ndarray:
    if not hasattr(values, "__len__"):  # generators and other one-shot iterables
        values = list(values)
    sample = np.asarray(values, dtype=np.float64)
    if sample.ndim != 1:
        raise ValueError(f"{what} needs a 1-D sequence of numbers, got shape {sample.shape}")
    if sample.size == 0:
        # An empty sample usually means no step of this kind ran (e.g. a run with no slow steps);
        # the caller should report "none" rather than a made-up number.
        raise ValueError(f"{what} of an empty sample: nothing was measured; check that the run produced "
                         "at least one value of this kind")
    return sample


def percentiles(values: Iterable[float]) -> dict:
    """Latency summary: p50, p90, p99, max, mean and the sample size n."""
    sample = _as_sample(values, "percentiles")
    p50, p90, p99 = np.percentile(sample, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(sample.max()),
        "mean": float(sample.mean()),
        "n": int(sample.size),
    }


def spread(values: Iterable[float]) -> dict:
    """Run-to-run spread of repeated measurements (e.g. throughput of >= 3 repeats).

    `rel_spread` = (max - min) / median says how far to trust the median; `iqr` = p75 - p25.
    A zero median with nonzero range gives an infinite relative spread rather than dividing by zero.
    """
    sample = _as_sample(values, "spread")
    median = float(np.median(sample))
    low, high = float(sample.min()), float(sample.max())
    p25, p75 = np.percentile(sample, [25, 75])
    value_range = high - low
    if median != 0.0:
        rel_spread = value_range / abs(median)
    else:
        rel_spread = 0.0 if value_range == 0.0 else float("inf")
    return {
        "median": median,
        "min": low,
        "max": high,
        "rel_spread": rel_spread,
        "iqr": float(p75 - p25),
        "n": int(sample.size),
    }
