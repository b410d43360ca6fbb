"""A throughput run's planned measurements (results.json's `progress.planned`) are the rows it makes, where
`--batch max` resolves to a batch also given as a number: that batch is measured once per method, so counted
once, in the fixed-context mode (each method at its own largest batch) and in request mode (one largest batch
for every method)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.runners import throughput_measure

TINY = ["throughput", "--model", "tiny-llama", "--device", "cpu", "--repeats", "1", "--methods", "full_kv,sfi",
        "--budget", "64", "--batch", "1,max", "--no-graphs"]
MODES = {"fixed-context": ["--ctx", "200", "--steps", "3"], "requests": ["--prompt-len", "200", "--gen-len", "3"]}


def own_largest(session, specs, *args, **kwargs) -> int:
    """The sizing `--batch max` uses, pinned: Full-KV alone fits one sequence, SFI alone two, both one."""
    return 1 if "full_kv" in {spec.name for spec in specs} else 2


@pytest.mark.parametrize("mode", MODES)
def test_planned_rows_are_the_rows_a_run_makes_when_max_is_a_batch_also_given(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(throughput_measure, "largest_fitting_batch", own_largest)
    out = tmp_path / mode
    result = CliRunner().invoke(app, [*TINY, *MODES[mode], "--out", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())["results"]
    shapes = sorted((row["method"], row["batch"]) for row in results["rows"])
    # fixed-context: Full-KV's own largest batch is the 1 also asked for, SFI's is 2; requests: 1 for both
    expected = [("full_kv", 1), ("sfi", 1), ("sfi", 2)] if mode == "fixed-context" else [("full_kv", 1), ("sfi", 1)]
    assert shapes == expected
    assert results["complete"] and results["progress"] == {"rows": len(shapes), "planned": len(shapes)}
