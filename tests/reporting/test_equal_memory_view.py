"""The throughput report's equal-memory view, on fabricated rows (no timing): the rows measured at each method's
own largest batch get a table of tok/s and tok/s per GiB in report.md and a third panel in throughput.png;
a run that asked for no "max" batch has neither."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib.figure
import pytest
from plot_bounds import problems

from sfibench.reporting import throughput_plots, throughput_report
from sfibench.reporting.throughput_equal_memory import GIB, largest_batch_rows, markdown_section

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def document(with_largest: bool) -> dict:
    """The committed CPU run, its SnapKV and Full-KV rows at 2K copied to their own largest batches (10 and 2,
    SnapKV on a compact cache) where `with_largest`."""
    doc = copy.deepcopy(json.loads((REPORTS / "ci/throughput/results.json").read_text()))
    rows = doc["results"]["rows"]
    for row in rows:
        row["largest_batch"] = False
    if with_largest:
        for method, batch, tok_s, held in (("full_kv", 2, 800.0, 3 * GIB), ("snapkv", 10, 3000.0, 2 * GIB)):
            base = next(r for r in rows if r["method"] == method and r["context"] == 2048)
            extra = copy.deepcopy(base) | {"batch": batch, "tokens_per_s": tok_s, "largest_batch": True,
                                           "peak_memory_bytes": None}
            extra["tokens_per_s_spread"] = {"min": tok_s * 0.99, "max": tok_s * 1.01, "rel_spread": 0.02}
            extra["memory_estimate"] = dict(base.get("memory_estimate", {}), total=held,
                                            prompt_cache=GIB // 8 if method == "snapkv" else 0)
            rows.append(extra)
    return doc


def drawn(rows: list[dict], path: Path) -> matplotlib.figure.Figure:
    figures = []
    original = throughput_plots.save
    throughput_plots.save = lambda fig, where: figures.append(fig)
    try:
        throughput_plots.throughput_figure(rows, path)
    finally:
        throughput_plots.save = original
    return figures[0]


def test_the_equal_memory_table_lists_each_method_at_its_largest_batch_with_tok_s_per_gib():
    rows = document(True)["results"]["rows"]
    assert [(r["method"], r["batch"]) for r in largest_batch_rows(rows)] == [("full_kv", 2), ("snapkv", 10)]
    text = "\n".join(markdown_section(rows, throughput_report.method_label))
    lines = [line for line in text.splitlines() if line.startswith("| ") and "2,048" in line]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert [(c[0], c[3], c[4], c[5], c[6], c[7]) for c in cells] == [
        ("full_kv", "2", "whole", "800.0", "3.00", "266.7"), ("snapkv", "10", "compact", "3,000.0", "2.00", "1,500.0")]
    assert "the run's memory estimate" in text  # no GPU peak in these rows
    markdown = throughput_report.markdown(document(True))
    assert "## Equal memory" in markdown and markdown.index("## Equal memory") < markdown.index("![throughput]")


def test_a_run_without_a_max_batch_has_no_equal_memory_view(tmp_path):
    doc = document(False)
    assert markdown_section(doc["results"]["rows"], throughput_report.method_label) == []
    assert "Equal memory" not in throughput_report.markdown(doc)
    assert len(drawn(doc["results"]["rows"], tmp_path / "t.png").axes) == 2


def test_the_plot_draws_tok_s_per_gib_at_equal_memory_in_a_third_panel(tmp_path):
    fig = drawn(document(True)["results"]["rows"], tmp_path / "t.png")
    assert len(fig.axes) == 3
    panel = fig.axes[2]
    heights = sorted(y for line in panel.get_lines() for y in line.get_ydata())
    assert heights == pytest.approx([800 / 3, 1500.0])
    assert "equal memory" in panel.get_title()
    assert problems(fig) == []
