"""README's `family` results block: one table across several throughput runs, from synthetic results.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sfibench.reporting.readme_results import generate
from sfibench.reporting.results import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def row(method: str, context: int, batch: int, tok_s: float, speedup: float, publish: str | None = None,
        peak: float = 10.0, estimate: float = 10.0, path: str = "optimized") -> dict:
    kind = {"full_kv": "dense", "sfi": "fast"}.get(method, "sparse")
    return {"method": method, "path": path, "context": context, "batch": batch, "publish": publish,
            "tokens_per_s": tok_s, "tokens_per_s_spread": {"min": tok_s, "max": tok_s}, "tokens_read_mean": 1.0,
            "achieved_gb_s": 1.0, "speedup_vs_full_kv": speedup, "speedup_supported": speedup > 1.05,
            "ms_per_step": {kind: {"p50": 2.5}}, "floor_ms": {kind: 2.0},
            "peak_memory_bytes": int(peak * GIB), "memory_estimate": {"decode_total": int(estimate * GIB)}}


def write_run(reports: Path, name: str, model: str, rows: list[dict], commit: str) -> None:
    document = {"schema_version": SCHEMA_VERSION, "command": "throughput",
                "config": {"model": model, "steps": 64, "repeats": 2},
                "provenance": {"device": "NVIDIA H200", "git_commit": commit, "timestamp_utc": "2026-12-05T10:00:00"},
                "results": {"rows": rows, "dtype": "bfloat16", "weights": "random weights at the real shape"}}
    (reports / name).mkdir(parents=True)
    (reports / name / "results.json").write_text(json.dumps(document))


def test_one_table_across_the_named_runs(tmp_path):
    write_run(tmp_path, "big", "qwen3-32b", [
        row("full_kv", 130944, 1, 40.0, 1.0, peak=93.0, estimate=93.4),
        row("sfi", 130944, 1, 50.0, 1.25, "next_step", peak=98.0, estimate=98.4),
        row("sfi", 130944, 1, 51.0, 1.27, "when_ready", peak=98.0, estimate=98.4),
        row("full_kv", 130944, 2, 60.0, 1.0),  # no other method ran at B=2
        row("sfi", 130944, 1, 3.0, 0.1, path="reference"),  # the optimized rows are shown, not these
    ], "aaaaaaaaaaaa")
    write_run(tmp_path, "small", "qwen3-8b", [
        row("sfi", 131072, 5, 2000.0, 4.0, "next_step", peak=120.0, estimate=122.0),
        row("full_kv", 32768, 5, 500.0, 1.0, peak=60.0, estimate=58.0),
        row("full_kv", 131072, 5, 500.0, 1.0),
        row("snapkv", 32768, 5, 510.0, 1.02),  # within the noise: no speedup claimed
    ], "bbbbbbbbbbbb")
    write_run(tmp_path, "again", "qwen3-32b", [row("full_kv", 130944, 1, 1.0, 1.0)], "cccccccccccc")
    text = generate("<!-- results:begin family big small again -->\nold\n<!-- results:end -->\n", tmp_path)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| model |"))
    assert header == "| model | context | B | full_kv | sfi sync | sfi async | snapkv | peak / estimate |"
    table = [line for line in lines if line.startswith("| [")]
    big, small = "| [qwen3-32b](reports/big/report.md)", "| [qwen3-8b](reports/small/report.md)"
    assert [line.split(" | ")[:3] for line in table] == [[big, "127.9K", "1"], [big, "127.9K", "2"],
                                                         [small, "32K", "5"], [small, "128K", "5"]]
    cells = [line.split(" | ")[3:] for line in table]
    assert cells[0] == ["40.0, 1.25x floor", "50.0 (1.25x), 1.25x floor", "51.0 (1.27x), 1.25x floor", "-",
                        "1.00 |"]  # the first run named wins over `again`; peaks 93.0/93.4 and 98.0/98.4
    assert cells[1] == ["60.0, 1.25x floor", "-", "-", "-", "1.00 |"]
    assert cells[2] == ["500.0, 1.25x floor", "-", "-", "510.0, 1.25x floor", "1.00-1.03 |"]
    assert cells[3][1] == "2,000.0 (4.00x), 1.25x floor" and cells[3][4] == "0.98-1.00 |"
    conditions = next(line for line in lines if line.startswith("**The qwen3 family**"))
    for name, commit in (("big", "aaaaaaaaaa"), ("small", "bbbbbbbbbb"), ("again", "cccccccccc")):
        assert f"[{name}](reports/{name}/report.md): commit {commit}, 2026-12-05, 64 decode steps x 2" in conditions
    assert "NVIDIA H200, bfloat16, random weights at the real shape" in conditions
    assert "old" not in text


def test_the_family_view_refuses_a_run_that_is_not_a_throughput_run():
    with pytest.raises(ValueError, match="the family view shows throughput runs"):
        generate("<!-- results:begin family stability-smollm2 -->\n<!-- results:end -->\n", ROOT / "reports")
