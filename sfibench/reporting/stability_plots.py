"""Plots for `sfibench stability`, drawn only from the results dict (as saved in results.json).

Every curve carries its 95% interval: over sentences for the drift and recall by offset, over step
pairs for the per-layer overlap (runs saved before the reducer kept sums of squares have none to
draw). The sample count behind each offset is drawn too (offsets seen in fewer than MIN_SAMPLES
sentences are left out), and the histograms show the whole distribution.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np

from sfibench.reporting.plot_style import legend_below

PLOTS = {"overlap_vs_offset.png": "Overlap with the sentence's first step, and memory recall, by offset",
         "within_vs_across.png": "Consecutive-step support overlap: within a sentence vs across a boundary",
         "recall_heatmap.png": "Recall per layer and KV head of every memory compared"}
MIN_SAMPLES = 10  # offsets reached by fewer sentences are left out of the drift plot
# results.json records each memory's label; runs saved without them compared these three
UNLABELLED = {"stale": "SFI, selected at t0 (stale)", "fresh": "SFI, selected at t (fresh)",
              "streaming": "StreamingLLM"}


def memory_labels(results: dict) -> dict[str, str]:
    """Name -> label of every memory the run compared, the budget reference's first; every memory but the
    reference's reads as many tokens per (layer, KV head) as its stale memory."""
    return {name: entry.get("label") or UNLABELLED.get(name, name) for name, entry in results["recall"].items()}


def _array(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _curve(ax, x, values, half_widths, hidden=None, **style) -> None:
    """A mean with its 95% interval as error bars; `hidden` points (too few samples) are left out."""
    y = _array(values)
    half = np.zeros_like(y) if half_widths is None else np.nan_to_num(_array(half_widths))
    if hidden is not None:
        y = np.where(hidden, np.nan, y)
    ax.errorbar(x, y, yerr=half, marker=".", capsize=2, elinewidth=0.8, **style)


def write_plots(run_dir: Path, results: dict) -> list[Path]:
    run_dir = Path(run_dir)
    paths = []
    for name, draw in (("overlap_vs_offset.png", _offset_plot), ("within_vs_across.png", _split_plot),
                       ("recall_heatmap.png", _heatmap)):
        fig = draw(results)
        fig.suptitle(f"{PLOTS[name]}\n{results['model']}, {results['mode']}, {results['steps']} steps", fontsize=10)
        fig.savefig(run_dir / name, dpi=110)
        plt.close(fig)
        paths.append(run_dir / name)
    return paths


def _offset_plot(results: dict):
    drift, consecutive = results["drift"], results["consecutive"]
    offsets = np.array(drift["offsets"])
    sparse = np.array(drift["samples"]) < MIN_SAMPLES  # a handful of long sentences: noise, not a trend
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    for kind, label in (("topk", "top-k support"), ("mass", "90%-mass support")):
        _curve(left, offsets, drift[f"{kind}_overlap"], drift.get(f"{kind}_overlap_ci95"), sparse,
               label=f"{label} vs t0 (95% CI over sentences)")
    for side, style in (("within", "--"), ("across", ":")):
        if consecutive["topk"][side]["overlap_mean"] is not None:  # None: no such step pair was seen
            left.axhline(consecutive["topk"][side]["overlap_mean"], color="grey", linestyle=style,
                         label=f"top-k, consecutive steps, {side}")
    left.axhline(results["chance_topk_overlap"], color="black", linewidth=0.8, label="top-k, chance (k/|C|)")
    left.set(xlabel=f"offset t - t0 (decode steps; last bin: >= {offsets[-1]})",
             ylabel="overlap with the support at t0 (share)", ylim=(0, 1.02))
    counts = left.twinx()
    counts.bar(offsets, drift["samples"], color="grey", alpha=0.15, width=0.8, label="sentences reaching the offset")
    counts.set_ylabel("sentences reaching the offset (count)", fontsize=8)
    left.set_zorder(counts.get_zorder() + 1)
    left.patch.set_visible(False)
    for name, label in memory_labels(results).items():
        recall = results["recall"][name]
        if np.isfinite(_array(recall["by_offset"])).any():  # a memory with nothing compared has no curve
            _curve(right, offsets, recall["by_offset"], recall.get("by_offset_ci95"), sparse, label=label)
    right.set(xlabel="offset t - t0 (decode steps)", ylabel="share of dense attention mass read")
    right.set_title("the other methods read as many tokens as SFI's stale memory", fontsize=8)
    legend_below(fig, [left, counts, right], columns=3)
    left.set_title(f"{drift['samples'][0]} sentences; offsets seen in fewer than {MIN_SAMPLES} are not drawn",
                   fontsize=8)
    return fig


SIDES = {"within": ("C0", "within a sentence"), "across": ("C1", "across a sentence boundary")}


def _split_plot(results: dict):
    consecutive, edges = results["consecutive"], np.array(results["hist_edges"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8), layout="constrained")
    for ax, (kind, metric, title) in zip(axes[:2], (("topk", "overlap", "top-k overlap"),
                                                    ("mass", "jaccard", "90%-mass Jaccard"))):
        means = []
        for side, (color, label) in SIDES.items():
            stats = consecutive[kind][side]
            counts = np.array(stats[f"{metric}_hist"])
            ax.stairs(counts / max(counts.sum(), 1), edges, fill=side == "within", alpha=0.5, color=color, label=label)
            mean = stats[f"{metric}_mean"]
            means.append(f"{side} {'n/a' if mean is None else f'{mean:.3f}'} ({stats['pairs']} pairs)")
        ax.set(xlabel=f"{title} (share)", ylabel="share of (step pair, layer, KV head)")
        ax.set_title(f"consecutive steps: {title}\nmean " + ", ".join(means), fontsize=9)
    for side, (color, label) in SIDES.items():
        stats = consecutive["topk"][side]
        per_layer = stats["overlap_per_layer"]
        _curve(axes[2], np.arange(len(per_layer)), per_layer, stats.get("overlap_per_layer_ci95"), color=color,
               label=label)
    axes[2].set(xlabel="layer", ylabel="mean top-k overlap (share)", ylim=(0, 1.02))
    axes[2].set_title("per layer (95% CI over step pairs)", fontsize=9)
    axes[2].set_xticks(range(0, len(per_layer), max(1, len(per_layer) // 10)))
    legend_below(fig, axes, columns=2)
    return fig


def _heatmap(results: dict):
    recall, labels = results["recall"], memory_labels(results)
    fig, axes = plt.subplots(2, len(labels), figsize=(3.4 * len(labels), 9.5), sharey=True, squeeze=False,
                             layout="constrained")
    for row, (key, what) in enumerate((("per_layer_head", "total mass"), ("candidate_per_layer_head",
                                                                        "mass inside candidates"))):
        grids = [np.array(recall[name][key], dtype=float) for name in labels]
        finite = [g[np.isfinite(g)] for g in grids]
        low = min((g.min() for g in finite if g.size), default=0.0)
        for ax, grid, label in zip(axes[row], grids, labels.values()):
            image = ax.imshow(grid, aspect="auto", vmin=low, vmax=1.0, cmap="viridis", interpolation="nearest")
            ax.set(title=f"{label}\n{what}", xlabel="KV head", xticks=range(grid.shape[1]))
        axes[row][0].set_ylabel("layer")
        fig.colorbar(image, ax=list(axes[row]), shrink=0.8, label=f"recall of {what}")
    return fig

