"""`sfibench report`: one run redrawn from its results.json alone, several runs side by side with deltas,
and each refusal one error line with exit 2 and nothing changed."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.reporting.results import read_results

REPORTS = Path(__file__).resolve().parents[2] / "reports"
RUNS = ["stability-smollm2", "quality-smollm2-ablation-w64", "throughput-qwen3-4b-h200", "profile-qwen3-4b-optimized-h200"]


def copy_results(name: str, target: Path, edit=None) -> Path:
    """A run directory holding only the committed run's results.json (optionally edited)."""
    target.mkdir(parents=True)
    document = json.loads((REPORTS / name / "results.json").read_text())
    if edit:
        edit(document)
    (target / "results.json").write_text(json.dumps(document))
    return target


def report(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["report", *map(str, args)])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("name", RUNS)
def test_one_run_is_redrawn_from_results_json_alone(tmp_path, name):
    run = copy_results(name, tmp_path / name)
    status, output = report(run)
    assert status == 0, output
    drawn = {path.name for path in run.iterdir()} - {"results.json"}
    committed = {path.name for path in (REPORTS / name).iterdir() if path.suffix in (".png", ".md")}
    assert drawn == committed - {"README.md"}


def test_two_runs_side_by_side_with_deltas(tmp_path):
    def slower(document):
        for row in document["results"]["rows"]:
            row["tokens_per_s"] *= 0.8

    first = copy_results("throughput-qwen3-4b-h200", tmp_path / "a")
    second = copy_results("throughput-qwen3-4b-h200", tmp_path / "b", slower)
    status, output = report(first, second, "--out", tmp_path / "cmp")
    assert status == 0, output
    text = (tmp_path / "cmp" / "report.md").read_text()
    assert "| run 1 | run 2 |" in text and "-20.0%)" in text
    names = {m["name"] for m in read_results(tmp_path / "cmp")["results"]["rows"]}
    assert {f"compare_{n}.png" for n in names} == {p.name for p in (tmp_path / "cmp").glob("*.png")}
    (tmp_path / "cmp" / "report.md").unlink()
    assert report(tmp_path / "cmp")[0] == 0  # a comparison is a run like any other: redrawn from its results.json
    assert (tmp_path / "cmp" / "report.md").read_text() == text


def test_every_setting_the_runs_differ_in_is_stated(tmp_path):
    def shorter(document):
        document["config"].update(steps=4, repeats=1)
        document["config"]["sfi"]["trigger"]["t_max"] = 48
        document["provenance"].update(torch="2.99.0", torch_threads=1)

    first = copy_results("ci/throughput", tmp_path / "a")
    second = copy_results("ci/throughput", tmp_path / "b", shorter)
    status, output = report(first, second, "--out", tmp_path / "cmp")
    assert status == 0, output
    torch = json.loads((first / "results.json").read_text())["provenance"]["torch"]
    assert "the runs differ in 5 settings" in output  # a table of them, a row each: setting, run 1, run 2
    for row in ("steps 32 4", "repeats 3 1", "sfi.trigger.t_max 96 48", f"provenance.torch {torch} 2.99.0",
                "provenance.torch_threads - 1"):
        assert f" {row} " in output, row
    text = (tmp_path / "cmp" / "report.md").read_text()
    for line in ("| steps | 32 | 4 |", "| repeats | 3 | 1 |", "| sfi.trigger.t_max | 96 | 48 |",
                 "| provenance.torch_threads | - | 1 |"):
        assert line in text
    same = copy_results("ci/throughput", tmp_path / "c")
    status, output = report(first, same, "--out", tmp_path / "same")
    assert status == 0 and "differ in" not in output
    assert "share every recorded setting" in (tmp_path / "same" / "report.md").read_text()


def test_runs_of_different_commands_are_refused(tmp_path):
    status, output = report(copy_results(RUNS[0], tmp_path / "a"), copy_results(RUNS[1], tmp_path / "b"),
                            "--out", tmp_path / "cmp")
    assert status == 2 and "different commands" in output
    assert not (tmp_path / "cmp").exists()


def test_a_missing_or_truncated_results_json_is_one_error(tmp_path):
    (tmp_path / "empty").mkdir()
    status, output = report(tmp_path / "empty")
    assert status == 2 and "holds no results.json" in output and "rerun its command" in output
    status, output = report(tmp_path / "gone")
    assert status == 2 and "gone does not exist" in output
    run = copy_results(RUNS[0], tmp_path / "cut")
    text = (run / "results.json").read_text()
    (run / "results.json").write_text(text[:1000])
    status, output = report(run)
    assert status == 2 and "is not valid JSON" in output
    assert [p.name for p in run.iterdir()] == ["results.json"]


def test_a_run_that_cannot_be_written_is_refused_untouched(tmp_path, monkeypatch):
    run = copy_results(RUNS[0], tmp_path / "run")
    real_open, root = os.open, str(run.resolve())

    def read_only(path, flags, *args, **kwargs):  # as a read-only mount: permissions do not stop root
        if flags & os.O_CREAT and os.path.abspath(os.fspath(path)).startswith(root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    status, output = report(run)
    assert status == 2 and "cannot write in" in output
    assert [p.name for p in run.iterdir()] == ["results.json"]


def test_out_is_only_for_comparisons(tmp_path):
    run = copy_results(RUNS[0], tmp_path / "run")
    status, output = report(run, "--out", tmp_path / "x")
    assert status == 2 and "--out" in output


def test_a_change_against_run_1_carries_both_runs_intervals():
    from sfibench.reporting.compare import _change

    first = {"value": 0.5, "low": 0.4, "high": 0.7}
    later = {"value": 0.2, "low": 0.1, "high": 0.25}
    delta, low, high = _change(first, later)
    assert delta == pytest.approx(-0.3)
    assert low == pytest.approx(-0.3 - (0.1 ** 2 + 0.2 ** 2) ** 0.5)  # later's lower side, first's upper side
    assert high == pytest.approx(-0.3 + (0.05 ** 2 + 0.1 ** 2) ** 0.5)
    assert _change(first, {"value": 0.6, "low": None, "high": None}) == (pytest.approx(0.1), None, None)
    assert _change({"value": None, "low": None, "high": None}, later) is None
