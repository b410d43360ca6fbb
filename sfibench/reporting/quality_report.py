"""A `sfibench quality` run drawn from its results.json: plots, report.md and the terminal table."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from sfibench.reporting.formatting import styled_table
from sfibench.reporting.quality_plots import plot_all
from sfibench.reporting.quality_summary import markdown, read_scope
from sfibench.reporting.results import read_results, write_text_atomically


def write_report(run_dir: Path | str) -> Path:
    """(Re)draw the plots and report.md of a quality run from its results.json alone."""
    run_dir = Path(run_dir)
    document = read_results(run_dir)
    cells = document["results"]["cells"]
    plots = [p.name for p in plot_all(cells, run_dir, read_scope(document["config"], cells))]
    report = run_dir / "report.md"
    write_text_atomically(report, markdown(document, plots))
    return report


def _read(cell: dict) -> float:
    """Tokens read / KV length: over the layers holding a selection where the run recorded it."""
    return cell["measured_retention"] if cell.get("measured_retention_global") is None else cell["measured_retention_global"]


WIDE_COLUMNS = ("task", "context", "method", "retention", "read", "accuracy [95% CI]", "KL", "top-1", "ppl")
# "budget": the retention as --budget takes it, a share of the context, to 4 digits (RULER's task names need
# the room at 80 columns; report.md and the wide view give it whole)
COMPACT_COLUMNS = ("task", "context", "method", "budget", "score", "KL")


def results_table(cells: list[dict], wide: bool = False) -> Table:
    """The terminal summary, one row per cell: a task's score (accuracy, or perplexity for ppl) and the KL to
    Full-KV; `wide` adds tokens read / context ("read": over the global layers, where a model has sliding
    ones), top-1 agreement, and accuracy and perplexity apart."""
    table = styled_table("sfibench quality", WIDE_COLUMNS if wide else COMPACT_COLUMNS,
                         right=("context", "retention", "budget", "read", "KL", "top-1", "ppl"))
    if not wide:
        table.caption = "score: accuracy [95% CI], or perplexity (ppl)"
    for c in cells:
        acc = None if c["accuracy"] is None else f"{c['accuracy']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"
        ppl = None if c["perplexity"] is None else f"{c['perplexity']:.2f}"
        share = "1" if c["retention"] is None else f"{c['retention']:{'g' if wide else '.4g'}}"
        head = (c["task"], str(c["context"]), c["method"], share)
        if wide:
            table.add_row(*head, f"{_read(c):.3f}", acc or "–", _figure(c["kl"], ".3f"),
                          _figure(c["top1_agreement"], ".2f"), ppl or "–")
        else:
            table.add_row(*head, acc or (f"ppl {ppl}" if ppl else "–"), _figure(c["kl"], ".3f"))
    return table


def _figure(value: float | None, spec: str) -> str:
    """A cell's figure; null is a figure the model's outputs did not give as a number (NaN, infinity)."""
    return "n/a" if value is None else format(value, spec)
