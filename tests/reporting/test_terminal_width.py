"""Every command's result table, drawn from committed results.json files, reads whole on an 80-column terminal.

A cell rich cannot fit is cut to '…' or wrapped onto a second line; both are caught here: no '…', no line
wider than 80, and each table row on one line of its own holding every value it should show, in full.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from sfibench.commands.info import env_table, fits_table, models_table
from sfibench.metrics.memory import planning_bytes
from sfibench.models.presets import PRESETS
from sfibench.reporting import profile_report, quality_report, stability_markdown, throughput_report
from sfibench.reporting.baseline import load
from sfibench.reporting.check import format_metric
from sfibench.reporting.check import table as check_table
from sfibench.reporting.gate import compare

REPORTS = Path(__file__).resolve().parents[2] / "reports"
WIDTH = 80


def committed(command: str) -> list[Path]:
    """Every committed results.json of one command (the CI baselines and the runs README and docs cite)."""
    found = sorted(p for p in REPORTS.rglob("results.json") if json.loads(p.read_text()).get("command") == command)
    assert found, f"no committed {command} run under {REPORTS}"
    return found


def render(table, width: int = WIDTH) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def body(text: str) -> list[str]:
    """The table's row lines: those after the rule under the header."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    return [line for line in lines[rule + 1:] if line.strip()]


def assert_readable(text: str, rows: list[tuple[str, ...]]) -> None:
    """No cut cell, no line over the width, and row i on line i with every one of its values whole."""
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    lines = body(text)
    assert len(lines) == len(rows), f"{len(rows)} rows drawn on {len(lines)} lines (a wrapped cell):\n{text}"
    for line, cells in zip(lines, rows):
        for cell in cells:
            assert cell in line, f"{cell!r} not whole in {line!r}"


def ids(paths: list[Path]) -> list[str]:
    return [str(p.parent.relative_to(REPORTS)) for p in paths]


THROUGHPUT = committed("throughput")


@pytest.mark.parametrize("path", THROUGHPUT, ids=ids(THROUGHPUT))
def test_throughput_table_fits(path):
    document = json.loads(path.read_text())
    rows = document["results"]["rows"]
    expected = [dict(zip(throughput_report.COLUMNS, cells)) for cells in throughput_report.table_rows(rows)]
    text = render(throughput_report.terminal_table(document))
    assert_readable(text, [(c["method"], c["path"], c["ctx"], c["batch"], c["tok/s"], c["spread"], c["speedup"], c["tokens read"])
                           for c in expected])


@pytest.mark.parametrize("path", THROUGHPUT, ids=ids(THROUGHPUT))
def test_throughput_wide_table_has_every_column_but_bandwidth_on_a_cpu(path):
    document = json.loads(path.read_text())
    header = body_header(render(throughput_report.terminal_table(document, wide=True), width=400))
    on_cpu = document["provenance"]["device"] == "cpu"
    for column in throughput_report.COLUMNS:
        assert (column in header) == (not on_cpu or column not in throughput_report.GPU_ONLY), column


def body_header(text: str) -> str:
    lines = text.splitlines()
    return lines[next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"}) - 1]


def test_a_gpu_and_a_cpu_throughput_run_are_both_checked():
    devices = {json.loads(p.read_text())["provenance"]["device"] == "cpu" for p in THROUGHPUT}
    assert devices == {True, False}


QUALITY = committed("quality")


@pytest.mark.parametrize("path", QUALITY, ids=ids(QUALITY))
def test_quality_table_fits(path):
    cells = json.loads(path.read_text())["results"]["cells"]
    text = render(quality_report.results_table(cells))
    expected = []
    for c in cells:
        score = (f"{c['accuracy']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" if c["accuracy"] is not None
                 else f"ppl {c['perplexity']:.2f}" if c["perplexity"] is not None else "–")
        expected.append((c["task"], str(c["context"]), c["method"], score, f"{c['kl']:.3f}"))
    caption = "score: accuracy [95% CI], or perplexity (ppl)"
    assert caption in text
    assert_readable("\n".join(line for line in text.splitlines() if caption not in line), expected)


STABILITY = committed("stability")


@pytest.mark.parametrize("path", STABILITY, ids=ids(STABILITY))
@pytest.mark.parametrize("wide", [False, True])
def test_stability_table_fits(path, wide):
    document = json.loads(path.read_text())
    segments = document["results"].get("segments") or [document["results"]]
    text = render(stability_markdown.terminal_table(document, wide))
    rows = body(text)
    assert "…" not in text and max(map(len, text.splitlines())) <= WIDTH, text
    if len(segments) > 1:  # a row per segment: its overlaps within and across, SFI's recall
        assert len(rows) == len(segments), text
        for row, segment in zip(rows, segments):
            topk = segment["consecutive"]["topk"]
            assert row.startswith(segment["label"]) and f"{segment['recall']['stale']['mean']:.3f}" in row
            assert f"{topk['within']['overlap_mean']:.3f}" in row and f"{topk['across']['overlap_mean']:.3f}" in row
        return
    (results,) = segments
    topk = results["consecutive"]["topk"]
    memories = len(results["recall"])
    assert len(rows) == (5 if wide else 2) + memories, text
    assert f"{topk['within']['overlap_mean']:.3f}" in rows[0] and f"{topk['across']['overlap_mean']:.3f}" in rows[0]
    assert f"{results['recall']['stale']['mean']:.3f}" in rows[-memories]


PROFILE = committed("profile")


@pytest.mark.parametrize("path", PROFILE, ids=ids(PROFILE))
@pytest.mark.parametrize("wide", [False, True])
def test_profile_table_fits(path, wide):
    document = json.loads(path.read_text())
    result = document["results"]
    text = render(profile_report.terminal_table(document, wide))
    timed = sorted(result["ms_per_step"].items(), key=lambda kv: -kv[1]) + [("wall time", result["wall_ms_per_step"])]
    refresh = list(result.get("per_refresh_ms", {}))
    assert_readable(text, [(name, f"{ms:.3f}") for name, ms in timed] + [(f"per refresh: {name}",) for name in refresh])


BASELINES = sorted(p.parent for p in REPORTS.rglob("baseline.json"))


@pytest.mark.parametrize("directory", BASELINES, ids=[p.name for p in BASELINES])
def test_check_table_fits(directory):
    baseline = load(directory)
    docs = {name: baseline.document(name) for name in baseline.runs}
    verdicts = [v for name, doc in docs.items() for v in compare(name, doc, doc, baseline)]
    text = render(check_table(verdicts))
    assert "…" not in text and max(map(len, text.splitlines())) <= WIDTH, text
    lines = iter(body(text))
    for v in verdicts:  # in order, each metric on its own line with both values and the verdict
        metric = v.key.rsplit("/", 1)[1]
        line = next(line for line in lines if line.strip().startswith(metric + " ") or line.strip() == metric)
        value = format_metric(v.baseline, interval=False)
        assert line.split()[1:] == [value, format_metric(v.current, interval=False), v.verdict], line


def test_models_table_fits():
    table, _ = models_table()
    text = render(table)
    assert_readable(text, [(cfg.name, cfg.arch, f"{cfg.max_context:,}", f"{cfg.kv_bytes_per_token():,} B")
                           for cfg in PRESETS.values()])


def test_models_fits_table_fits():
    """`sfibench models --memory 139.8GiB`'s table of what fits: a line per preset with its six values whole,
    then the caption, nothing wider than 80 columns."""
    total = int(139.8 * (1 << 30))
    text = render(fits_table("cuda", planning_bytes(total, total), "139.8 GiB"))
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= WIDTH, text
    for line, name in zip(body(text), PRESETS):
        assert line.split()[0] == name and len(line.split()) == 7, line


def test_env_table_fits():
    text = render(env_table(torch.device("cpu")))
    assert "…" not in text and max(map(len, text.splitlines())) <= WIDTH, text
    assert "cuda available" in text and torch.__version__ in text
