"""Plots for `sfibench stability`, drawn only from the results dict (as saved in results.json).

Every curve and bar carries its 95% interval: over sentences for the drift and recall by offset, over
step pairs for the consecutive overlaps, over steps for the recall per layer (runs saved before the
reducer kept sums of squares have none to draw). The sample count behind each offset is drawn too
(offsets seen in fewer than MIN_SAMPLES sentences are left out). A run of several segments (contexts x
prompts) draws one curve, bar group or panel per segment; the figures a run has no data for (heads,
distances, needles, triggers: runs saved before they were measured) are not drawn.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np

from sfibench.reporting.plot_style import legend_below, save, wrapped
from sfibench.reporting.stability_document import REFERENCE, layer_names, memory_labels, segments
from sfibench.reporting.stability_plots_where import WHERE_PLOTS

PLOTS = {"overlap_vs_offset.png": "Overlap with the sentence's first step, and memory recall, by offset",
         "within_vs_across.png": "Consecutive-step support overlap: within a sentence vs across a boundary",
         "recall_heatmap.png": "Recall of the dense attention mass per layer of every memory compared",
         **{name: title for name, (title, _, _) in WHERE_PLOTS.items()}}
MIN_SAMPLES = 5  # offsets reached by fewer sentences are left out of the drift plot
CONTEXT_COLOURS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
PROMPT_STYLES = ("-", "--", ":", "-.")


def _array(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _mean(values) -> float:
    """The mean of the measured values; NaN where there are none (a memory that compared nothing)."""
    known = _array(values)
    known = known[np.isfinite(known)]
    return float(known.mean()) if known.size else np.nan


def _curve(ax, x, values, half_widths, hidden=None, **style) -> None:
    """A mean with its 95% interval as error bars; `hidden` points (too few samples) are left out."""
    y = _array(values)
    half = np.zeros_like(y) if half_widths is None else np.nan_to_num(_array(half_widths))
    if hidden is not None:
        y = np.where(hidden, np.nan, y)
    ax.errorbar(x, y, yerr=half, **{"marker": ".", "capsize": 2, "elinewidth": 0.8, **style})


def segment_styles(results: dict) -> dict[str, dict]:
    """label -> line style of each segment: colour by context, line style by prompt source."""
    segs = segments(results)
    contexts = sorted({s.get("context_asked") or 0 for s in segs})
    sources = list(dict.fromkeys(f"{s.get('prompt_source', 'text')} {s.get('mode', '')}" for s in segs))
    return {s["label"]: {"color": CONTEXT_COLOURS[contexts.index(s.get("context_asked") or 0) % len(CONTEXT_COLOURS)],
                         "linestyle": PROMPT_STYLES[sources.index(f"{s.get('prompt_source', 'text')} {s.get('mode', '')}")
                                                    % len(PROMPT_STYLES)]} for s in segs}


def _title(results: dict) -> str:
    segs = segments(results)
    if len(segs) == 1:
        return f"{results['model']}, {segs[0]['mode']}, {segs[0]['steps']} steps"
    return f"{results['model']}, {len(segs)} segments of {max(s['steps'] for s in segs)} steps at most"


def write_plots(run_dir: Path, results: dict) -> list[Path]:
    run_dir = Path(run_dir)
    draws = {"overlap_vs_offset.png": _offset_plot, "within_vs_across.png": _split_plot,
             "recall_heatmap.png": _heatmap}
    draws.update({name: draw for name, (_, draw, has) in WHERE_PLOTS.items() if has(results)})
    paths = []
    for name, draw in draws.items():
        fig = draw(results)
        fig.suptitle(f"{PLOTS[name]}\n{_title(results)}", fontsize=10)
        save(fig, run_dir / name)
        paths.append(run_dir / name)
    return paths


def _offset_plot(results: dict):
    segs, styles = segments(results), segment_styles(results)
    single = len(segs) == 1
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), layout="constrained")
    for seg in segs:
        drift = seg["drift"]
        offsets = np.array(drift["offsets"])
        sparse = np.array(drift["samples"]) < MIN_SAMPLES  # a handful of long sentences: noise, not a trend
        kinds = (("topk", "top-k support"), ("mass", "90%-mass support")) if single else (("topk", ""),)
        for kind, what in kinds:
            style = {} if single else styles[seg["label"]]
            _curve(left, offsets, drift[f"{kind}_overlap"], drift.get(f"{kind}_overlap_ci95"), sparse,
                   label=f"{what or seg['label']} vs t0 (95% CI over sentences)", **style)
        if single:
            _reference_lines(left, seg)
            for name, label in memory_labels(seg).items():
                recall = seg["recall"][name]
                if np.isfinite(_array(recall["by_offset"])).any():  # a memory with nothing compared has no curve
                    _curve(right, offsets, recall["by_offset"], recall.get("by_offset_ci95"), sparse, label=label)
        else:
            recall = seg["recall"][REFERENCE]
            _curve(right, offsets, recall["by_offset"], recall.get("by_offset_ci95"), sparse, **styles[seg["label"]])
    last = segs[0]["drift"]["offsets"][-1]
    left.set(xlabel=f"offset t - t0 (decode steps; last bin: >= {last})",
             ylabel="top-k overlap with the support at t0 (share)", ylim=(0, 1.02))
    sentences = ", ".join(str(seg["drift"]["samples"][0]) for seg in segs)
    left.set_title(f"sentences: {sentences}; offsets seen in fewer than {MIN_SAMPLES} are not drawn", fontsize=8)
    right.set(xlabel="offset t - t0 (decode steps)", ylabel="share of dense attention mass read")
    right.set_title("the other methods read as many tokens as SFI's stale memory" if single else
                    wrapped(f"{memory_labels(segs[0])[REFERENCE]}: recall by offset", 60), fontsize=8)
    if single:
        _sentence_counts(left, segs[0])
    legend_below(fig, fig.axes, columns=3)
    return fig


def _reference_lines(ax, seg: dict) -> None:
    consecutive = seg["consecutive"]
    for side, style in (("within", "--"), ("across", ":")):
        if consecutive["topk"][side]["overlap_mean"] is not None:  # None: no such step pair was seen
            ax.axhline(consecutive["topk"][side]["overlap_mean"], color="grey", linestyle=style,
                       label=f"top-k, consecutive steps, {side}")
    ax.axhline(seg["chance_topk_overlap"], color="black", linewidth=0.8, label="top-k, chance (k/|C|)")


def _sentence_counts(ax, seg: dict) -> None:
    drift = seg["drift"]
    counts = ax.twinx()
    counts.bar(drift["offsets"], drift["samples"], color="grey", alpha=0.15, width=0.8,
               label="sentences reaching the offset")
    counts.set_ylabel("sentences reaching the offset (count)", fontsize=8)
    ax.set_zorder(counts.get_zorder() + 1)
    ax.patch.set_visible(False)


SIDES = {"within": ("C0", "within a sentence"), "across": ("C1", "across a sentence boundary")}


def _split_plot(results: dict):
    segs, styles = segments(results), segment_styles(results)
    fig, (bars, layers) = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained",
                                       gridspec_kw={"width_ratios": (max(len(segs), 2), 3)})
    width = 0.38
    for i, (side, (color, label)) in enumerate(SIDES.items()):
        means = [seg["consecutive"]["topk"][side]["overlap_mean"] for seg in segs]
        errors = [seg["consecutive"]["topk"][side].get("overlap_ci95") for seg in segs]
        bars.bar(np.arange(len(segs)) + (i - 0.5) * width, _array(means), width, color=color, alpha=0.7,
                 yerr=np.nan_to_num(_array(errors)), capsize=3, label=f"top-k overlap, {label}")
    chance = [seg["chance_topk_overlap"] for seg in segs]
    bars.scatter(np.arange(len(segs)), chance, marker="_", s=300, color="black", label="chance (k/|C|)", zorder=3)
    bars.set_xticks(range(len(segs)), [wrapped(seg["label"], 12) for seg in segs], fontsize=8)
    bars.set(ylabel="consecutive-step top-k overlap (share)", ylim=(0, 1.02))
    bars.set_title("95% CI over step pairs", fontsize=9)
    for seg in segs:
        names = layer_names(results, seg)
        for side, (color, label) in SIDES.items():
            stats = seg["consecutive"]["topk"][side]
            style = {"color": color} if len(segs) == 1 else {**styles[seg["label"]],
                                                             "marker": "o" if side == "within" else "x"}
            _curve(layers, np.arange(len(names)), stats["overlap_per_layer"], stats.get("overlap_per_layer_ci95"),
                   label=label if len(segs) == 1 else f"{seg['label']}, {side}", **{"alpha": 0.9, **style})
    names = layer_names(results, segs[0])
    step = max(1, len(names) // 10)
    layers.set_xticks(range(0, len(names), step), names[::step])
    layers.set(xlabel="layer", ylabel="mean top-k overlap (share)", ylim=(0, 1.02))
    layers.set_title("per layer (95% CI over step pairs)", fontsize=9)
    legend_below(fig, [bars, layers], columns=3)
    return fig


def _heatmap(results: dict):
    segs = segments(results)
    columns = min(len(segs), 3)
    rows = -(-len(segs) // columns)
    labels = memory_labels(segs[0])
    fig, axes = plt.subplots(rows, columns, figsize=(max(6.5, 1.2 + 1.1 * len(labels) * columns), 1.8 + 2.6 * rows),
                             squeeze=False, layout="constrained")
    for ax, seg in zip(axes.flat, segs):
        labels = memory_labels(seg)
        names = layer_names(results, seg)
        grid = np.array([[_mean(row) for row in seg["recall"][name]["per_layer_head"]]
                         for name in labels], dtype=float).T  # [layers, memories]: the mean over KV heads
        image = ax.imshow(grid, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
        ax.set_xticks(range(len(labels)), [wrapped(label, 18) for label in labels.values()], fontsize=7,
                      rotation=60, ha="right", rotation_mode="anchor")
        step = max(1, len(names) // 12)
        ax.set_yticks(range(0, len(names), step), names[::step])
        ax.set(ylabel="layer", title=seg["label"])
        if grid.size <= 60:
            errors = _layer_errors(seg, labels)
            for (layer, column), value in np.ndenumerate(grid):
                if not np.isfinite(value):
                    continue
                text = f"{value:.2f}" if not np.isfinite(errors[layer, column]) else \
                    f"{value:.2f}\n±{errors[layer, column]:.2f}"
                ax.text(column, layer, text, ha="center", va="center", fontsize=6,
                        color="white" if value < 0.6 else "black")
    for ax in axes.flat[len(segs):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, shrink=0.8, label="recall of the dense mass (mean over KV heads)")
    return fig


def _layer_errors(seg: dict, labels: dict) -> np.ndarray:
    """The 95% half-width per (layer, memory) of the mean over KV heads: the heads' intervals combined as
    if independent (NaN where the run kept none)."""
    grids = []
    for name in labels:
        ci = seg["recall"][name].get("per_layer_head_ci95")
        if ci is None:
            grids.append(np.full(len(seg["recall"][name]["per_layer_head"]), np.nan))
            continue
        half = np.array(_nested(ci), dtype=float)
        grids.append(np.sqrt((half ** 2).sum(axis=1)) / half.shape[1])
    return np.array(grids).T


def _nested(rows) -> list[list[float]]:
    return [[np.nan if v is None else v for v in row] for row in rows]
