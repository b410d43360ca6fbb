"""long_fidelity.png: fidelity to Full-KV along long answers, step by step, with the slow steps marked.

Records of answers of at least 256 decode steps keep their per-step KL(full || method) and top-1
agreement under teacher forcing on Full-KV's own answer (runners/quality_batch.long_fidelity). One row
per (task, context, retention), so the methods in a row read the same budget; one line per method: the
mean over the samples at each step (those still answering), smoothed by a rolling mean. Ticks at the
bottom of a panel mark the methods' slow steps (every sample's), where SFI refreshed its selection.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.transforms import blended_transform_factory

from sfibench.reporting.plot_style import context_label, legend_below, save

WINDOW = 32  # steps in the rolling mean
PANELS = [("kl_steps", "KL(full || method), nats"), ("top1_steps", "top-1 agreement")]


def rolling_mean(values: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Mean of the last `window` values at each step (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], values]))
    steps = np.arange(1, len(values) + 1)
    low = np.maximum(steps - window, 0)
    return (sums[steps] - sums[low]) / (steps - low)


def mean_per_step(arrays: list[list[float]]) -> np.ndarray:
    """Mean over the arrays at each index, over those long enough to have it."""
    longest = max(len(a) for a in arrays)
    total, count = np.zeros(longest), np.zeros(longest)
    for a in arrays:
        total[:len(a)] += a
        count[:len(a)] += 1
    return total / count


def plot_long_fidelity(samples: list[dict], path: Path, colors: dict) -> Path | None:
    """The figure, or None when no record kept per-step fidelity."""
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for record in samples:
        if record.get("kl_steps"):
            groups[(record["task"], record["context"], record["retention"])][record["method"]].append(record)
    if not groups:
        return None
    keys = sorted(groups)
    fig, axes = plt.subplots(len(keys), len(PANELS), figsize=(13, 3.0 * len(keys) + 0.8), squeeze=False,
                             layout="constrained")
    for i, key in enumerate(keys):
        task, context, retention = key
        for j, (field, label) in enumerate(PANELS):
            ax = axes[i][j]
            ticks = blended_transform_factory(ax.transData, ax.transAxes)
            for k, (method, records) in enumerate(sorted(groups[key].items())):
                series = rolling_mean(mean_per_step([r[field] for r in records]))
                ax.plot(np.arange(len(series)), series, lw=1.1, color=colors.get(method),
                        label=method)
                slow = [s for r in records for s in r.get("taught_slow_steps", [])]
                if slow:  # a rug per method, stacked so two methods' ticks do not hide each other
                    ax.plot(slow, [0.02 + 0.05 * k] * len(slow), "|", ms=6, alpha=0.5, color=colors.get(method),
                            transform=ticks)
            if field == "kl_steps":
                ax.set_yscale("symlog", linthresh=1e-3)
            else:
                ax.set_ylim(-0.05, 1.05)
            ax.set_title(f"{task} @ {context_label(context)} tokens, retention {retention:g}", fontsize=9)
            ax.set_ylabel(f"{label}\n(rolling mean of {WINDOW} steps)", fontsize=8)
            ax.set_xlabel("decode step of Full-KV's answer (teacher-forced); ticks: slow steps")
            ax.grid(alpha=0.3)
    legend_below(fig, axes.flat)
    save(fig, path)
    return path

