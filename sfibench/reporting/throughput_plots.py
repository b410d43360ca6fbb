"""A throughput run's plots, rebuilt from results.json: throughput.png and latency.png.

The speedup panel applies the table's rule (speedup_claims.py): a ratio is drawn, with its range over
the timed passes, wherever the run measured a difference, below 1x where the method was slower; every
other point is drawn hollow at 1x, "no difference measured". The panel's caption names those points, and
the rows that read as many tokens as Full-KV, and says why.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sfibench import registry
from sfibench.reporting.plot_style import context_axis, legend_below, log_axis, save, yerr
from sfibench.reporting.speedup_claims import same_tokens_note, speedup_claim, verdict_notes
from sfibench.reporting.throughput_equal_memory import draw as draw_equal_memory
from sfibench.reporting.throughput_report import method_label

CAPTION_WIDTH = 80  # characters per line of the speedup panel's caption (a 6-inch panel at 8 points)


def plot(rows: list[dict], run_dir: Path) -> list[Path]:
    """throughput.png (tokens/s and speedup by context, bars = range over the timed passes) and
    latency.png (per-step latency percentiles by step kind at the longest context)."""
    return [throughput_figure(rows, run_dir / "throughput.png"), latency_figure(rows, run_dir / "latency.png")]


def throughput_figure(rows: list[dict], path: Path) -> Path:
    """Tokens/s and speedup by context (equal batch), and where the run measured each method at its own largest
    batch a third panel: tokens/s per GiB at equal memory (throughput_equal_memory.py)."""
    equal_memory = any(r.get("largest_batch") for r in rows)
    fig, axes = plt.subplots(1, 3 if equal_memory else 2, figsize=(18 if equal_memory else 12, 5.4),
                             layout="constrained")
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        series.setdefault((method_label(r), r["path"], r["batch"]), []).append(r)
    # colour = method and path, line and marker = batch, so sixteen series stay distinguishable
    colours = {pair: f"C{i % 10}" for i, pair in enumerate(sorted({key[:2] for key in series}))}
    batches = sorted({key[2] for key in series}, key=str)
    for (method, path_name, batch), points in sorted(series.items(), key=lambda item: str(item[0])):
        points.sort(key=lambda r: r["context"])
        style = {"marker": "osD^"[batches.index(batch) % 4], "ls": ["-", "--", ":", "-."][batches.index(batch) % 4],
                 "ms": 4, "capsize": 3, "color": colours[(method, path_name)], "label": f"{method}/{path_name} B={batch}"}
        speed = [p["tokens_per_s"] for p in points]
        axes[0].errorbar([p["context"] for p in points], speed,
                         yerr=yerr(speed, [p["tokens_per_s_spread"]["min"] for p in points],
                                   [p["tokens_per_s_spread"]["max"] for p in points]), **style)
        _speedup_series(axes[1], points, rows, style)
    contexts = [r["context"] for r in rows]
    for ax, (title, unit) in zip(axes, (("decode throughput", "tokens/s (log scale)"),
                                        ("speedup vs the fastest Full-KV path", "x Full-KV tokens/s"))):
        context_axis(ax, contexts)
        ax.set_title(f"{title}; bars: range over the timed passes", fontsize=9)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    log_axis(axes[0])
    axes[1].axhline(1.0, color="grey", lw=0.8)
    notes = verdict_notes(rows, method_label)
    if notes:
        axes[1].plot([], [], ls="none", marker="o", mfc="none", color="grey",
                     label="hollow at 1x: no difference measured")
    notes += [note for note in (same_tokens_note(rows, method_label),) if note]
    if notes:
        caption = "\n".join(textwrap.fill(note, CAPTION_WIDTH) for note in notes)
        axes[1].set_xlabel(f"context (tokens)\n{caption}", fontsize=8)
    if equal_memory:
        draw_equal_memory(axes[2], rows, method_label, context_axis)
    legend_below(fig, axes, columns=4)
    save(fig, path)
    return path


def _speedup_series(ax, points: list[dict], rows: list[dict], style: dict) -> None:
    """One series on the speedup panel: claimed ratios with their range, the rest hollow at 1x. Dense rows
    are the reference (the line at 1x) and are not drawn."""
    if registry.get(points[0]["method"]).dense:
        return
    claims = [(p["context"], speedup_claim(p, rows)) for p in points]
    claimed = [(x, c) for x, c in claims if c is not None and c.supported]
    if claimed:
        ratio = [c.ratio for _, c in claimed]
        ax.errorbar([x for x, _ in claimed], ratio, yerr=yerr(ratio, [c.low for _, c in claimed],
                                                              [c.high for _, c in claimed]), **style)
    unclaimed = [x for x, c in claims if c is not None and not c.supported]
    if unclaimed:
        ax.plot(unclaimed, [1.0] * len(unclaimed), ls="none", marker=style["marker"], mfc="none", ms=7,
                color=style["color"], label=None if claimed else style["label"])


PERCENTILES = (("p50", "C0"), ("p90", "C1"), ("p99", "C2"), ("max", "C3"))


def latency_figure(rows: list[dict], path: Path) -> Path:
    longest = max(r["context"] for r in rows)
    chosen = [r for r in rows if r["context"] == longest]
    labels = [(r, kind) for r in chosen for kind in r["ms_per_step"]]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4.8), layout="constrained")
    for i, (r, kind) in enumerate(labels):
        stats = r["ms_per_step"][kind]
        ax.plot([i, i], [stats["p50"], stats["max"]], color="grey", lw=1)
        for name, color in PERCENTILES:
            ax.scatter([i], [stats[name]], color=color, s=18, zorder=3, label=name)
    ax.set_xticks(range(len(labels)), [f"{method_label(r)}/{r['path']}\nB={r['batch']} {kind} (n={r['ms_per_step'][kind]['n']})"
                                       for r, kind in labels], fontsize=7, rotation=30, ha="right")
    ax.set_xlim(-0.6, len(labels) - 0.4)
    log_axis(ax)
    ax.set_ylabel("ms per decode step (log scale)")
    ax.set_title(f"step latency by kind at {longest:,} tokens: spread over every timed step", fontsize=9)
    ax.grid(alpha=0.3)
    legend_below(fig, [ax], columns=4)
    save(fig, path)
    return path
