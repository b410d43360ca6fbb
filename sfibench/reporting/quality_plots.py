"""Plots of a quality run, drawn from its summarised cells (matplotlib, Agg backend, PNG files).

- accuracy_vs_retention.png: one panel per (task, context); each sparse method's accuracy with its
  95% interval against the retention it actually read; Full-KV as a horizontal band.
- fidelity_vs_retention.png: KL(full || method), top-1 agreement and greedy-token agreement per
  task, one line per method and context.
- perplexity_vs_retention.png: perplexity on long prose (task ppl), when it ran.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"full_kv": "black", "sfi": "tab:red", "streaming_llm": "tab:blue", "snapkv": "tab:green"}


def _series(cells: list[dict], task: str, context: int, method: str) -> list[dict]:
    return sorted((c for c in cells if c["task"] == task and c["context"] == context and c["method"] == method),
                  key=lambda c: c["retention"] or 1.0)


def plot_accuracy(cells: list[dict], path: Path) -> Path | None:
    scored = [c for c in cells if c.get("accuracy") is not None]
    tasks = sorted({c["task"] for c in scored})
    contexts = sorted({c["context"] for c in scored})
    if not tasks:
        return None
    methods = sorted({c["method"] for c in scored} - {"full_kv"})
    fig, axes = plt.subplots(len(tasks), len(contexts), figsize=(4.2 * len(contexts), 3.0 * len(tasks)),
                             squeeze=False, sharex=True, sharey=True)
    for i, task in enumerate(tasks):
        for j, context in enumerate(contexts):
            ax = axes[i][j]
            for full in _series(scored, task, context, "full_kv"):
                ax.axhline(full["accuracy"], color="black", lw=1.2, label="full_kv")
                ax.axhspan(full["ci_low"], full["ci_high"], color="black", alpha=0.08)
            for method in methods:
                series = _series(scored, task, context, method)
                if series:
                    x = [c["measured_retention"] for c in series]
                    y = [c["accuracy"] for c in series]
                    # clamped: a Wilson bound at accuracy 0 or 1 can miss it by a rounding error, and
                    # matplotlib refuses a negative error bar
                    err = [[max(c["accuracy"] - c["ci_low"], 0.0) for c in series],
                           [max(c["ci_high"] - c["accuracy"], 0.0) for c in series]]
                    ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, color=COLORS.get(method), label=method)
            ax.set_title(f"{task} @ {context} tokens", fontsize=9)
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
            if i == len(tasks) - 1:
                ax.set_xlabel("measured retention (tokens read / KV length)")
            if j == 0:
                ax.set_ylabel("accuracy (95% CI)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_fidelity(cells: list[dict], path: Path) -> Path | None:
    """One row per task (answers and prose differ in scale), one column per metric; line style = context."""
    sparse = [c for c in cells if c["method"] != "full_kv"]
    if not sparse:
        return None
    tasks, contexts = sorted({c["task"] for c in sparse}), sorted({c["context"] for c in sparse})
    styles = ["-", "--", ":", "-."]
    metrics = [("kl", "KL(full || method), nats"), ("top1_agreement", "top-1 agreement (teacher-forced)"),
               ("token_agreement", "greedy-token agreement")]
    fig, axes = plt.subplots(len(tasks), len(metrics), figsize=(13, 3.0 * len(tasks)), squeeze=False)
    for i, task in enumerate(tasks):
        for j, (key, label) in enumerate(metrics):
            ax = axes[i][j]
            for method in sorted({c["method"] for c in sparse}):
                for k, context in enumerate(contexts):
                    series = [c for c in _series(sparse, task, context, method) if c.get(key) is not None]
                    if series:
                        ax.plot([c["retention"] for c in series], [c[key] for c in series], marker="o", ms=3,
                                ls=styles[k % len(styles)], color=COLORS.get(method), label=f"{method} {context}")
            if not ax.lines:  # e.g. greedy-token agreement of a teacher-forced-only task
                ax.text(0.5, 0.5, "not applicable", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"{task}: {label}", fontsize=9)
            ax.set_xlabel("nominal retention (budget / context)")
            ax.grid(alpha=0.3)
    handles = {line.get_label(): line for ax in axes.flat for line in ax.lines}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(contexts) * 2, fontsize=7)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * (len(handles) // (len(contexts) * 2)), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_perplexity(cells: list[dict], path: Path) -> Path | None:
    ppl = [c for c in cells if c.get("perplexity") is not None]
    if not ppl:
        return None
    contexts = sorted({c["context"] for c in ppl})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.2), squeeze=False)
    for j, context in enumerate(contexts):
        ax = axes[0][j]
        for c in _series(ppl, "ppl", context, "full_kv"):
            ax.axhline(c["perplexity"], color="black", lw=1.2, label="full_kv")
        for method in sorted({c["method"] for c in ppl} - {"full_kv"}):
            series = _series(ppl, "ppl", context, method)
            ax.plot([c["measured_retention"] for c in series], [c["perplexity"] for c in series], marker="o",
                    color=COLORS.get(method), label=method)
        ax.set_title(f"perplexity @ {context} tokens", fontsize=9)
        ax.set_xlabel("measured retention")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(cells: list[dict], run_dir: Path) -> list[Path]:
    made = [plot_accuracy(cells, run_dir / "accuracy_vs_retention.png"),
            plot_fidelity(cells, run_dir / "fidelity_vs_retention.png"),
            plot_perplexity(cells, run_dir / "perplexity_vs_retention.png")]
    return [p for p in made if p is not None]
