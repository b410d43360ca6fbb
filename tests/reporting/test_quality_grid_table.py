"""The `grid` results block: one table across several quality runs, from synthetic results.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sfibench.commands.sfi_options import SETTINGS, VARIANT, SFISettings
from sfibench.reporting.quality_grid_table import variant_flags
from sfibench.reporting.quality_paired import SOLVED
from sfibench.reporting.readme_results import generate
from sfibench.reporting.results import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
LEGEND = f"‡ Full-KV below {SOLVED:g}: the row decides nothing"


def cell(task: str, context: int, method: str, retention: float | None, accuracy: float, n: int = 100) -> dict:
    return {"task": task, "context": context, "method": method, "retention": retention, "n": n,
            "accuracy": accuracy, "perplexity": None}


def write_run(reports: Path, name: str, cells: list[dict], methods: list[str], retentions: list[float],
              preset: str | None = None, variant: dict | None = None, complete: bool = True,
              commit: str = "aaaaaaaaaaaa", tasks: list[str] | None = None) -> None:
    tasks = tasks or sorted({c["task"] for c in cells})
    config = {"model": "qwen2.5-coder-1.5b", "methods": methods, "tasks": tasks,
              "contexts": sorted({c["context"] for c in cells}), "retentions": retentions, "samples": [100],
              "path": "optimized", "sfi_preset": preset, "sfi_variant": variant}
    document = {"schema_version": SCHEMA_VERSION, "command": "quality", "config": config,
                "provenance": {"device": "NVIDIA H100 80GB HBM3", "git_commit": commit,
                               "timestamp_utc": "2026-12-06T08:00:00"},
                "results": {"cells": cells, "complete": complete}}
    (reports / name).mkdir(parents=True)
    (reports / name / "results.json").write_text(json.dumps(document))


def grid(reports: Path, *names: str) -> list[str]:
    text = generate(f"<!-- results:begin grid {' '.join(names)} -->\nold\n<!-- results:end -->\n", reports)
    assert "old" not in text
    return text.splitlines()


def table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """The header's column names and each row's cells."""
    rows = [line.strip("|").split(" | ") for line in lines if line.startswith("| ")]
    return [name.strip() for name in rows[0]], [[value.strip() for value in row] for row in rows[2:]]


PRESET = [2308 / 32000, 4356 / 32000]  # paper-2k / paper-4k at 32,000 tokens


def spec_run(reports: Path) -> None:
    """Every method at the two presets on niah_single, and 0.15 / 0.5 where SnapKV ran only at 0.15."""
    write_run(reports, "spec", [
        cell("niah_single", 32000, "full_kv", None, 1.0),
        *(cell("niah_single", 32000, "sfi", r, a) for r, a in zip(PRESET, (0.0, 0.1), strict=True)),
        *(cell("niah_single", 32000, "snapkv", r, a) for r, a in zip(PRESET, (0.97, 1.0), strict=True)),
    ], ["full_kv", "sfi", "snapkv"], PRESET, preset="paper-2k,paper-4k", commit="1111111111aa")


def test_runs_at_the_same_task_context_and_retentions_share_a_row_and_a_variant_has_its_column(tmp_path):
    spec_run(tmp_path)
    write_run(tmp_path, "no-nms", [
        cell("niah_single", 32000, "full_kv", None, 0.5),  # the first named run's Full-KV wins
        *(cell("niah_single", 32000, "sfi", r, a) for r, a in zip(PRESET, (0.79, 0.94), strict=True)),
    ], ["full_kv", "sfi"], PRESET, preset="paper-2k,paper-4k", variant={"use_nms": False}, commit="2222222222bb")
    write_run(tmp_path, "keep7", [
        *(cell("niah_single", 32000, "sfi", r, a) for r, a in zip(PRESET, (0.99, 0.98), strict=True)),
    ], ["full_kv", "sfi"], PRESET, preset="paper-2k,paper-4k", variant={"use_nms": False, "keep_neighbours": 7})
    write_run(tmp_path, "retention", [
        cell("niah_single", 32000, "full_kv", None, 1.0),
        cell("niah_single", 32000, "sfi", 0.15, 0.2), cell("niah_single", 32000, "sfi", 0.5, 0.6),
        cell("niah_single", 32000, "snapkv", 0.15, 0.9),
    ], ["full_kv", "sfi", "snapkv"], [0.15, 0.5])
    lines = grid(tmp_path, "keep7", "spec", "no-nms", "retention")
    header, rows = table(lines)
    # registry order, Full-KV first; the variants after plain SFI, in the order the block names them
    assert header == ["task", "context", "budget", "n", "full_kv", "sfi", "sfi --no-nms --keep-neighbours 7",
                      "sfi --no-nms", "snapkv"]
    assert rows == [["niah_single", "31.2K", "paper-2k / paper-4k", "100", "1.00", "0.00 / 0.10",
                     "0.99 / 0.98", "0.79 / 0.94", "0.97 / 1.00"],
                    ["niah_single", "31.2K", "0.15 / 0.5", "100", "1.00", "0.20 / 0.60", "-", "-", "0.90 / -"]]
    lines = grid(tmp_path, "spec", "no-nms")
    header, rows = table(lines)
    assert header[-2:] == ["sfi --no-nms", "snapkv"]
    assert rows == [["niah_single", "31.2K", "paper-2k / paper-4k", "100", "1.00", "0.00 / 0.10", "0.79 / 0.94",
                     "0.97 / 1.00"]]
    conditions = next(line for line in lines if line.startswith("**qwen2.5-coder-1.5b**"))
    assert "optimized path, on NVIDIA H100 80GB HBM3" in conditions
    assert "paper-2k / paper-4k = 2,308 / 4,356 tokens" in conditions
    assert "[spec](reports/spec/report.md): commit 1111111111, 2026-12-06" in conditions
    assert "[no-nms](reports/no-nms/report.md): commit 2222222222, 2026-12-06." in conditions
    assert LEGEND not in lines


def test_a_partial_run_shows_its_prompt_counts_as_a_range_and_missing_cells_as_dashes(tmp_path):
    write_run(tmp_path, "partial", [
        cell("niah_list", 16384, "full_kv", None, 0.98, n=100),
        cell("niah_list", 16384, "sfi", 0.15, 0.0, n=64),
        cell("niah_multikey", 16384, "full_kv", None, 0.96, n=40),
    ], ["full_kv", "sfi", "quest"], [0.15], complete=False)
    lines = grid(tmp_path, "partial")
    header, rows = table(lines)
    assert header == ["task", "context", "budget", "n", "full_kv", "sfi", "quest"]
    assert rows == [["niah_list", "16K", "0.15", "64-100", "0.98", "0.00", "-"],
                    ["niah_multikey", "16K", "0.15", "40", "0.96", "-", "-"]]
    conditions = next(line for line in lines if line.startswith("**"))
    assert "[partial](reports/partial/report.md): commit aaaaaaaaaa, 2026-12-06, stopped early (partial)" in conditions


def test_only_a_row_whose_full_kv_is_below_the_threshold_is_marked(tmp_path):
    below = round(SOLVED - 0.06, 2)
    write_run(tmp_path, "mixed", [
        cell("niah_multivalue", 8192, "full_kv", None, below), cell("niah_multivalue", 8192, "sfi", 0.15, 0.01),
        cell("niah_single", 8192, "full_kv", None, SOLVED), cell("niah_single", 8192, "sfi", 0.15, 0.5),
    ], ["full_kv", "sfi"], [0.15])
    lines = grid(tmp_path, "mixed")
    _, rows = table(lines)
    assert [row[4] for row in rows] == [f"{below:.2f} ‡", f"{SOLVED:.2f}"]  # tasks in the order first seen
    assert lines.count(LEGEND) == 1 and lines.index(LEGEND) > max(i for i, line in enumerate(lines)
                                                                  if line.startswith("| "))
    write_run(tmp_path, "solved", [cell("niah_single", 8192, "full_kv", None, 0.9)], ["full_kv"], [0.15])
    assert LEGEND not in grid(tmp_path, "solved")


def test_the_variant_column_is_named_by_the_flags_that_run_it():
    for name in VARIANT:  # every setting a quality variant may change, through the command line's own mapping
        setting = SETTINGS[name]
        value = {bool: True, int: 3, float: 0.25, str: "visible"}[setting.kind]
        variant = SFISettings(((name, value),)).variant()
        flag = setting.flag or f"--{name.replace('_', '-')}"
        assert variant_flags(variant) == (flag if setting.kind is bool else f"{flag} {value}"), name
    assert variant_flags({"use_nms": False, "keep_neighbours": 7}) == "--no-nms --keep-neighbours 7"


def test_the_grid_view_refuses_a_run_that_is_not_a_quality_run():
    with pytest.raises(ValueError, match="the grid view shows quality runs"):
        generate("<!-- results:begin grid throughput-qwen3-4b-h200 -->\n<!-- results:end -->\n", ROOT / "reports")


def test_rows_follow_the_tasks_order_the_run_asked_for(tmp_path):
    """results.json lists cells sorted by name; the table keeps the order of the run's --tasks."""
    cells = [cell(task, 8192, "full_kv", None, 1.0) for task in ("niah_multikey", "niah_single", "vt")]
    write_run(tmp_path, "run", cells, ["full_kv"], [0.15], tasks=["vt", "niah_single", "niah_multikey"])
    _, rows = table(grid(tmp_path, "run"))
    assert [row[0] for row in rows] == ["vt", "niah_single", "niah_multikey"]
