"""Plots of a quality run, drawn from its summarised cells and per-sample records (PNG files).

- accuracy_vs_retention.png: one panel per (task, context); each sparse method's accuracy with its
  95% interval against the retention it actually read; Full-KV as a line with its interval as a band.
- fidelity_vs_retention.png: KL(full || method), top-1 agreement and greedy-token agreement per
  task, one line per method and context, each point with its 95% interval over the samples.
- perplexity_vs_retention.png: perplexity on long prose (task ppl), when it ran, with intervals.
- long_fidelity.png: KL and top-1 agreement step by step along long answers, slow steps marked
  (quality_long_fidelity.py), when a run kept them.

Cells hold means only, so the intervals of fidelity and perplexity come from the per-sample records
saved in the same results.json (the same intervals `sfibench report` and `check` show).
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sfibench import registry
from sfibench.reporting.plot_style import context_label, legend_below, save, wrapped, yerr
from sfibench.reporting.quality_long_fidelity import plot_long_fidelity
from sfibench.reporting.results import read_results
from sfibench.reporting.run_metrics import interval

# one colour per method, in the registry's order (the dense method black)
COLORS = dict(zip(registry.names(), ("black", "tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple",
                                     "tab:brown", "tab:pink")))
STYLES = ["-", "--", ":", "-."]
FIDELITY = [("kl", "KL(full || method) (nats)"), ("top1_agreement", "top-1 agreement (share of steps)"),
            ("token_agreement", "greedy-token agreement (share of tokens)")]


def _series(cells: list[dict], task: str, context: int, method: str) -> list[dict]:
    return sorted((c for c in cells if c["task"] == task and c["context"] == context and c["method"] == method),
                  key=lambda c: c["retention"] or 1.0)


def sample_intervals(samples: list[dict]) -> dict[tuple, tuple[float, float]]:
    """(task, context, method, retention, metric) -> 95% interval of the cell's mean over its samples."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in samples:
        groups[(record["task"], record["context"], record["method"], record["retention"])].append(record)
    intervals = {}
    for cell, records in groups.items():
        for metric, _ in FIDELITY:
            values = [r[metric] for r in records if r.get(metric) is not None]
            if values:
                intervals[(*cell, metric)] = interval(values)[1:]
        nlls = [r["nll"] for r in records if r.get("nll") is not None]
        if nlls:
            low, high = interval(nlls)[1:]
            intervals[(*cell, "perplexity")] = (math.exp(low), math.exp(high))
    return intervals


def _bars(series: list[dict], key: str, intervals: dict) -> list[list[float]]:
    bounds = [intervals.get((c["task"], c["context"], c["method"], c["retention"], key), (None, None)) for c in series]
    return yerr([c[key] for c in series], [b[0] for b in bounds], [b[1] for b in bounds])


def _crowded(retentions: list[float]) -> bool:
    """Whether upright labels at these retentions would run into each other: retentions crowd at the low end
    (0.1, 0.15, 0.2 beside 0.5), so a close pair on a wide span collides even when there are few of them."""
    gaps = [b - a for a, b in pairwise(retentions)]
    return len(retentions) > 4 or (bool(gaps) and min(gaps) < 0.15 * (retentions[-1] - retentions[0]))


def _xlabel(scope: dict) -> str:
    return "measured retention (tokens read / KV length" + (", global layers)" if scope["key"].endswith("global")
                                                             else ", all layers)")


def plot_accuracy(cells: list[dict], path: Path, scope: dict) -> Path | None:
    scored = [c for c in cells if c.get("accuracy") is not None]
    tasks = sorted({c["task"] for c in scored})
    contexts = sorted({c["context"] for c in scored})
    if not tasks:
        return None
    methods = sorted({c["method"] for c in scored} - {registry.dense().name})
    fig, axes = plt.subplots(len(tasks), len(contexts), figsize=(4.2 * len(contexts), 3.0 * len(tasks) + 0.6),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    for i, task in enumerate(tasks):
        for j, context in enumerate(contexts):
            ax = axes[i][j]
            for full in _series(scored, task, context, registry.dense().name):
                ax.axhline(full["accuracy"], color="black", lw=1.2, label="full_kv (band: 95% CI)")
                ax.axhspan(full["ci_low"], full["ci_high"], color="black", alpha=0.08)
            for method in methods:
                series = _series(scored, task, context, method)
                if series:
                    err = yerr([c["accuracy"] for c in series], [c["ci_low"] for c in series],
                               [c["ci_high"] for c in series])
                    ax.errorbar([c[scope["key"]] for c in series], [c["accuracy"] for c in series],
                                yerr=err, marker="o", ms=4, capsize=3, color=COLORS.get(method), label=method)
            n = next(c["n"] for c in scored if (c["task"], c["context"]) == (task, context))
            ax.set_title(f"{task} @ {context_label(context)} tokens (n={n})", fontsize=9)
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
            if i == len(tasks) - 1:
                ax.set_xlabel(wrapped(_xlabel(scope), 40))
            if j == 0:
                ax.set_ylabel("accuracy (share, 95% CI)")
    legend_below(fig, axes.flat)
    save(fig, path)
    return path


def plot_fidelity(cells: list[dict], intervals: dict, path: Path) -> Path | None:
    """One row per task (answers and prose differ in scale), one column per metric; line style = context."""
    sparse = [c for c in cells if c["method"] != registry.dense().name]
    if not sparse:
        return None
    tasks, contexts = sorted({c["task"] for c in sparse}), sorted({c["context"] for c in sparse})
    retentions = sorted({c["retention"] for c in sparse})
    fig, axes = plt.subplots(len(tasks), len(FIDELITY), figsize=(13, 3.0 * len(tasks) + 0.8), squeeze=False,
                             layout="constrained")
    for i, task in enumerate(tasks):
        for j, (key, label) in enumerate(FIDELITY):
            ax = axes[i][j]
            for method in sorted({c["method"] for c in sparse}):
                for k, context in enumerate(contexts):
                    series = [c for c in _series(sparse, task, context, method) if c.get(key) is not None]
                    if series:
                        ax.errorbar([c["retention"] for c in series], [c[key] for c in series],
                                    yerr=_bars(series, key, intervals), marker="o", ms=3, capsize=2,
                                    ls=STYLES[k % len(STYLES)], color=COLORS.get(method),
                                    label=f"{method} @ {context_label(context)} tokens")
            if not ax.has_data():  # e.g. greedy-token agreement of a teacher-forced-only task
                ax.text(0.5, 0.5, "not applicable", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"{task}", fontsize=9)
            ax.set_ylabel(label, fontsize=8)
            slant = {"rotation": 45, "ha": "right", "fontsize": 7} if _crowded(retentions) else {}
            ax.set_xticks(retentions, [f"{r:g}" for r in retentions], **slant)
            ax.set_xlabel("nominal retention (budget / context)")
            ax.grid(alpha=0.3)
    legend_below(fig, axes.flat, columns=2 * len(contexts))
    save(fig, path)
    return path


def plot_perplexity(cells: list[dict], intervals: dict, path: Path, scope: dict) -> Path | None:
    ppl = [c for c in cells if c.get("perplexity") is not None]
    if not ppl:
        return None
    contexts = sorted({c["context"] for c in ppl})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.8), squeeze=False, layout="constrained")
    for j, context in enumerate(contexts):
        ax = axes[0][j]
        for c in _series(ppl, "ppl", context, registry.dense().name):
            ax.axhline(c["perplexity"], color="black", lw=1.2, label="full_kv (band: 95% CI)")
            low, high = intervals.get(("ppl", context, registry.dense().name, None, "perplexity"), (c["perplexity"],) * 2)
            ax.axhspan(low, high, color="black", alpha=0.08)
        for method in sorted({c["method"] for c in ppl} - {registry.dense().name}):
            series = _series(ppl, "ppl", context, method)
            ax.errorbar([c[scope["key"]] for c in series], [c["perplexity"] for c in series],
                        yerr=_bars(series, "perplexity", intervals), marker="o", ms=4, capsize=3,
                        color=COLORS.get(method), label=method)
        n = next(c["n"] for c in ppl if c["context"] == context)
        ax.set_title(f"ppl @ {context_label(context)} tokens (n={n})", fontsize=9)
        ax.set_xlabel(wrapped(_xlabel(scope), 40))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("perplexity (exp of mean NLL per token)")
    legend_below(fig, axes.flat)
    save(fig, path)
    return path


def plot_all(cells: list[dict], run_dir: Path, scope: dict) -> list[Path]:
    """`scope` (quality_summary.read_scope): which measured retention the x axes show, and over what."""
    samples = read_results(run_dir).get("samples") or []
    intervals = sample_intervals(samples)
    made = [plot_accuracy(cells, run_dir / "accuracy_vs_retention.png", scope),
            plot_fidelity(cells, intervals, run_dir / "fidelity_vs_retention.png"),
            plot_perplexity(cells, intervals, run_dir / "perplexity_vs_retention.png", scope),
            plot_long_fidelity(samples, run_dir / "long_fidelity.png", COLORS)]
    return [p for p in made if p is not None]
