"""A CPU throughput run's verdict as measured, on fabricated results (no timing): a slower method reads
slower in the table, report.md and the speedup panel; "same tokens" marks a measured ratio and never stands
in for it; only overlapping pass ranges are "no difference measured"; one line says why the sparse methods
are slower on a CPU's reference path and where their speed shows."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib.figure
from plot_bounds import problems

from sfibench.reporting import throughput_plots, throughput_report
from sfibench.reporting.speedup_claims import speedup_claim

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def passes(median: float, half: float) -> dict:
    return {"min": median * (1 - half), "max": median * (1 + half), "rel_spread": 2 * half}


def cpu_document() -> dict:
    """The committed CPU run (smollm2, 1K and 2K) with its speeds replaced: at 1K SFI reads every token and is
    0.34x Full-KV, StreamingLLM is within Full-KV's range; at 2K SFI reads a fifth of the tokens at 0.42x and
    SnapKV is 1.30x faster."""
    document = copy.deepcopy(json.loads((REPORTS / "ci/throughput/results.json").read_text()))
    rows = document["results"]["rows"]
    speeds = {("full_kv", 1024): 1671.1, ("sfi", 1024): 570.6, ("streaming_llm", 1024): 1660.0,
              ("snapkv", 1024): 900.0, ("full_kv", 2048): 1500.0, ("sfi", 2048): 630.0,
              ("streaming_llm", 2048): 700.0, ("snapkv", 2048): 1950.0}
    for row in rows:
        row["tokens_per_s"] = speeds[row["method"], row["context"]]
        row["tokens_per_s_spread"] = passes(row["tokens_per_s"], 0.02)
    sfi_1k = next(r for r in rows if r["method"] == "sfi" and r["context"] == 1024)
    sfi_1k["tokens_read_mean"] = next(r for r in rows if r["method"] == "full_kv" and r["context"] == 1024)[
        "tokens_read_mean"]
    return document


def row(rows: list[dict], method: str, context: int) -> dict:
    return next(r for r in rows if r["method"] == method and r["context"] == context)


def speedup_cells(rows: list[dict]) -> dict[tuple[str, int], str]:
    table = throughput_report.table_rows(rows)
    return {(r["method"], r["context"]): cells[-2] for r, cells in zip(rows, table)}


def drawn(rows: list[dict], path: Path) -> matplotlib.figure.Figure:
    figures = []
    original = throughput_plots.save
    throughput_plots.save = lambda fig, where: figures.append(fig)
    try:
        throughput_plots.throughput_figure(rows, path)
    finally:
        throughput_plots.save = original
    return figures[0]


def test_a_slower_method_is_a_ratio_below_one_even_when_it_reads_every_token():
    rows = cpu_document()["results"]["rows"]
    cells = speedup_cells(rows)
    assert cells[("sfi", 1024)] == "0.34x (same tokens)"  # measured slower, and says it read everything
    assert cells[("sfi", 2048)] == "0.42x" and cells[("snapkv", 2048)] == "1.30x"
    assert cells[("streaming_llm", 1024)] == "= in the noise"  # the one row whose passes overlap Full-KV's
    assert cells[("full_kv", 1024)] == "ref"
    claim = speedup_claim(row(rows, "sfi", 1024), rows)
    assert claim.supported and claim.same_tokens and claim.high < 1


def test_overlapping_passes_are_the_only_no_difference_measured():
    document = cpu_document()
    rows = document["results"]["rows"]
    # its fastest pass now reaches into Full-KV's range
    row(rows, "sfi", 2048)["tokens_per_s_spread"] = {"min": 600.0, "max": 1480.0, "rel_spread": 880 / 630}
    cells = speedup_cells(rows)
    assert cells[("sfi", 2048)] == "= in the noise" and cells[("sfi", 1024)] == "0.34x (same tokens)"
    report = throughput_report.markdown(document)
    line = next(text for text in report.splitlines() if text.startswith("- No difference measured where"))
    assert "has a tok/s range over the timed passes that overlaps" in line
    assert "sfi/reference at 2,048" in line


def test_the_speedup_panel_draws_slower_rows_below_one_and_only_the_noise_hollow(tmp_path):
    rows = cpu_document()["results"]["rows"]
    figure = drawn(rows, tmp_path / "throughput.png")
    panel = figure.axes[1]
    marked = [line for line in panel.lines
              if len(line.get_xdata()) and line.get_marker() not in ("", "None", None)]
    points = [(x, y, line.get_markerfacecolor() == "none") for line in marked
              for x, y in zip(line.get_xdata(), line.get_ydata())]
    filled = {(round(float(x)), round(float(y), 2)) for x, y, hollow in points if not hollow}
    assert (1024, 0.34) in filled and (2048, 0.42) in filled and (2048, 1.3) in filled
    assert [(x, y) for x, y, hollow in points if hollow] == [(1024, 1.0)]  # StreamingLLM, in the noise
    caption = " ".join(panel.get_xlabel().split())
    assert "streaming_llm/reference at 1,024" in caption and "same tokens: sfi/reference at 1,024" in caption
    assert problems(figure) == []


def test_one_line_says_why_sparse_methods_are_slower_on_a_cpu_and_where_their_speed_shows():
    document = cpu_document()
    notes = throughput_report.table_notes(document)
    why = [note for note in notes if "CPU's reference path" in note]
    assert len(why) == 1 and "bandwidth" in why[0] and "GPU's optimized path" in why[0] and "README" in why[0]
    assert why[0] in throughput_report.markdown(document)
    assert any(note.startswith("same tokens: sfi/reference at 1,024 read as many tokens") for note in notes)
    faster = copy.deepcopy(document)  # nothing slower: no line explaining slowness
    for r in faster["results"]["rows"]:
        if r["method"] != "full_kv":
            r["tokens_per_s"] *= 5
            r["tokens_per_s_spread"] = passes(r["tokens_per_s"], 0.02)
    assert not [note for note in throughput_report.table_notes(faster) if "CPU's reference path" in note]
    gpu = copy.deepcopy(document)
    gpu["provenance"]["device"] = "NVIDIA H100 80GB HBM3"
    assert not [note for note in throughput_report.table_notes(gpu) if "CPU's reference path" in note]
