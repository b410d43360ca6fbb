"""`sfibench report` shows results in the terminal: redrawing one run prints its table (as the command that
made it did), and comparing runs prints the settings they differ in and the metrics side by side as tables,
each value as a reader writes it, never as Python's text of a list or dict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.commands import common

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def copied(name: str, where: Path) -> Path:
    target = where / name.replace("/", "-")
    shutil.copytree(REPORTS / name, target)
    return target


def test_redrawing_a_run_prints_its_table_and_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    run = copied("ci/throughput", tmp_path)
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    table = [line for line in lines if line.split() and line.split()[0] in ("full_kv", "sfi", "snapkv")]
    assert len(table) == 6 and all("reference" in line for line in table), result.output  # 3 methods x 2 ctx
    assert any(" ref " in f"{line} " for line in table) and "wrote" in result.output


def test_comparing_runs_prints_tables_not_python_text(tmp_path, monkeypatch):
    # a 200-column terminal: the console is made at import, so COLUMNS set now would not reach it (and an
    # xdist worker's output is a pipe, 80 columns, where every metric name is cut to '...')
    monkeypatch.setattr(common.console, "_width", 200)
    first, second = copied("ci/quality", tmp_path / "a"), copied("ci/quality", tmp_path / "b")
    document = json.loads((second / "results.json").read_text())
    document["config"]["samples"] = [8]
    document["config"]["sfi_settings"] = [{"context": 1024, "retention": 0.15, "k_head": 96, "n_recent": 48}]
    (second / "results.json").write_text(json.dumps(document))
    result = CliRunner().invoke(app, ["report", str(first), str(second), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "{'" not in text and "['" not in text, text
    setting = next(line for line in text.splitlines() if line.startswith("sfi_settings.0"))
    assert setting.split()[1] == "-" and "context 1024, retention 0.15, k_head 96, n_recent 48" in setting
    assert any(line.split()[:3] == ["samples", "4", "8"] for line in text.splitlines()), text
    assert "quality/niah_single sfi@0.15@1024/accuracy" in " ".join(text.split())  # the metrics, side by side


def test_an_80_column_comparison_shows_every_metric_name_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(common.console, "_width", 80)
    first, second = copied("ci/quality", tmp_path / "a"), copied("ci/quality", tmp_path / "b")
    result = CliRunner().invoke(app, ["report", str(first), str(second), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output
    metric_column = "".join(line[:20] for line in result.output.splitlines() if line.startswith(("quality/", " ")))
    assert "…" not in metric_column, result.output  # no name cut to '...'
