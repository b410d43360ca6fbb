"""The stability plots of which heads move, where the moving mass sits, the needle at the answer steps,
and the two refresh triggers; each drawn only for runs that measured it (WHERE_PLOTS says which)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np

from sfibench.reporting.plot_style import legend_below, wrapped
from sfibench.reporting.stability_document import REFERENCE, layer_names, memory_labels, segments

MOVING_SERIES = (("dense_mass", "dense attention mass"), ("missed_by_stale", "mass the stale SFI memory misses"),
                 ("entering_within", "positions entering the top-k, within a sentence"),
                 ("entering_across", "positions entering the top-k, across a boundary"))


def _values(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _mean(values) -> float:
    known = _values(values)
    known = known[np.isfinite(known)]
    return float(known.mean()) if known.size else np.nan


def _panels(count: int, width: float, height: float, columns: int = 3):
    columns = min(count, columns)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns + 1.0, height * rows + 1.6), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def _heads(results: dict):
    segs = [seg for seg in segments(results) if seg.get("head_overlap", {}).get("within")]
    heads = len(segs[0]["head_overlap"]["within"]["overlap"][0])
    fig, axes = _panels(len(segs), max(2.4, 0.75 * heads + 1.2), 2.6)
    for ax, seg in zip(axes, segs):
        within = seg["head_overlap"]["within"]
        grid = np.array([_values(row) for row in within["overlap"]])
        errors = np.array([_values(row) for row in within["overlap_ci95"]])
        image = ax.imshow(grid, aspect="auto", vmin=0.0, vmax=1.0, cmap="magma", interpolation="nearest")
        names = layer_names(results, seg)
        step = max(1, len(names) // 12)
        ax.set_yticks(range(0, len(names), step), names[::step])
        ax.set_xticks(range(grid.shape[1]), range(grid.shape[1]))
        ax.set(xlabel="query head (grouped by KV head)", ylabel="layer", title=wrapped(seg["label"], 30))
        if grid.size <= 60:
            for (layer, head), value in np.ndenumerate(grid):
                ax.text(head, layer, f"{value:.2f}\n±{np.nan_to_num(errors[layer, head]):.2f}", ha="center",
                        va="center", fontsize=6, color="white" if value < 0.5 else "black")
    fig.colorbar(image, ax=axes, shrink=0.8, label="top-k overlap of consecutive steps within a sentence")
    return fig


def _moving(results: dict):
    segs = [seg for seg in segments(results) if seg.get("moving_mass")]
    bins = segs[0]["moving_mass"]["bins"]
    fig, axes = plt.subplots(1, len(MOVING_SERIES), figsize=(4.0 * len(MOVING_SERIES), 4.4), sharey=True,
                             layout="constrained")
    width = 0.8 / len(segs)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title) in zip(axes, MOVING_SERIES):
        for i, seg in enumerate(segs):
            series = seg["moving_mass"][key]
            ax.bar(np.arange(len(bins)) + (i - (len(segs) - 1) / 2) * width, _values(series["mean"]), width,
                   yerr=np.nan_to_num(_values(series["ci95"])), capsize=2, color=colours[i % len(colours)],
                   label=seg["label"])
        ax.set_xticks(range(len(bins)), bins, fontsize=8)
        ax.set(xlabel="tokens behind the current one")
        ax.set_title(wrapped(title, 34), fontsize=9)
    axes[0].set_ylabel("share per step (mean, 95% CI over steps)")
    legend_below(fig, axes, columns=3)
    return fig


def _needle(results: dict):
    segs = [seg for seg in segments(results) if seg.get("needle")]
    fig, axes = _panels(len(segs), 4.6, 3.4, columns=2)
    for ax, seg in zip(axes, segs):
        needle, labels = seg["needle"], memory_labels(seg)
        steps = [entry["step"] for entry in needle["steps"]]
        for name, label in labels.items():
            held = [_mean(entry["held"][name]) if name in entry["held"] else np.nan
                    for entry in needle["steps"]]
            ax.plot(steps, held, marker="o", markersize=3, label=label)
        slow = [entry["step"] for entry in needle["steps"] if entry["slow"]]
        for step in slow:
            ax.axvline(step, color="grey", linewidth=0.6, linestyle=":")
        mass = ax.twinx()
        mass.plot(steps, [_mean(entry["needle_mass"]) for entry in needle["steps"]], color="black",
                  linestyle="--", linewidth=1, label="dense attention mass on the needle (right axis)")
        mass.set_ylabel("mass on the needle", fontsize=8)
        mass.set_ylim(0, None)
        verdict = "answered" if needle["answered"] else "not answered"
        ax.set(xlabel="answer step", ylabel="share of the needle's tokens held", ylim=(-0.02, 1.05))
        ax.set_title(wrapped(f"{seg['label']}: needle {needle['value']!r} at depth {needle.get('depth')}, "
                             f"{verdict}", 48), fontsize=8)
    legend_below(fig, [*axes, *(ax for ax in fig.axes if ax not in axes)], columns=3,
                 caption=wrapped("mean over analysed layers and KV heads; one prompt each, so no interval; dotted: "
                                 "SFI refreshes (a dense step)", 60))
    return fig


def _trigger(results: dict):
    segs = [seg for seg in segments(results) if seg.get("trigger")]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 * len(segs) + 2.5), 4.4), layout="constrained")
    width = 0.38
    for i, (side, colour) in enumerate((("sentence", "C0"), ("fixed", "C2"))):
        values = [seg["trigger"][side]["recall"] for seg in segs]
        errors = [seg["trigger"][side]["recall_ci95"] for seg in segs]
        label = "refreshed at sentence starts" if side == "sentence" else "refreshed every N steps (N matched)"
        ax.bar(np.arange(len(segs)) + (i - 0.5) * width, _values(values), width, yerr=np.nan_to_num(_values(errors)),
               capsize=3, color=colour, alpha=0.75, label=label)
    ax.set_xticks(range(len(segs)), [wrapped(f"{seg['label']} (N = {seg['trigger']['interval']}; refreshes "
                                             f"{seg['trigger']['sentence']['refreshes']} / "
                                             f"{seg['trigger']['fixed']['refreshes']})", 16) for seg in segs],
                  fontsize=7)
    measured = [seg["trigger"][side]["recall"] for seg in segs for side in ("sentence", "fixed")]
    low = min((v for v in measured if v is not None), default=0.0)
    ax.set(ylabel="recall of the dense mass over every step", ylim=(max(0.0, low - 0.1), 1.0))
    ax.set_title(wrapped(f"{memory_labels(segs[0])[REFERENCE]}: a refresh step counts 1 (dense); 95% CI "
                         "over steps", 70), fontsize=8)
    legend_below(fig, [ax], columns=2)
    return fig


def _has(key: str):
    return lambda results: any(seg.get(key) for seg in segments(results))


WHERE_PLOTS = {  # name -> (title, draw, whether the run has its data)
    "head_stability.png": ("Within-sentence stability of each query head's own top-k support", _heads,
                           lambda results: any(seg.get("head_overlap", {}).get("within") for seg in segments(results))),
    "moving_mass.png": ("Where attention and what moves sit, by distance behind the current token", _moving,
                        _has("moving_mass")),
    "needle.png": ("The needle's tokens in each memory at the answer steps", _needle, _has("needle")),
    "trigger.png": ("Refreshing at sentence starts vs at a fixed interval of the same rate", _trigger, _has("trigger")),
}
