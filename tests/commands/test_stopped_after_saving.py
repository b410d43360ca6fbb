"""A run stopped (SIGTERM, Ctrl-C) after its results.json is whole keeps it and says so, never "nothing was
saved"; `--resume` on such a folder draws the report without measuring again, and refuses settings that differ
from the run's record, naming each. Real tiny throughput and profile runs; the signal is sent from inside the
process at the moment under test, as a `timeout` would send it from outside."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path

import pytest
from refusals import one_line_error
from tiny_runs import TINY_RUNS
from typer.testing import CliRunner

from sfibench.cli import app

RUNS = TINY_RUNS
RUNNER_MODULE = {command: f"sfibench.runners.{command}" for command in RUNS}
TABLE_MODULE = {"throughput": "sfibench.reporting.throughput_report", "profile": "sfibench.reporting.profile_report",
                "stability": "sfibench.reporting.stability_markdown"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stop_with(signum: int):
    def stop(*args, **kwargs):
        os.kill(os.getpid(), signum)  # delivered to the command's handler, as from outside
        raise AssertionError("the signal did not stop the command")
    return stop


@pytest.mark.parametrize("command", list(RUNS))
@pytest.mark.parametrize("signum, status, how", [(signal.SIGTERM, 143, "terminated (SIGTERM):"),
                                                  (signal.SIGINT, 130, "interrupted:")])
def test_a_signal_while_the_report_is_drawn_keeps_the_run_and_resume_draws_it(tmp_path, monkeypatch, command,
                                                                              signum, status, how):
    import importlib

    out = tmp_path / "run"
    monkeypatch.setattr(importlib.import_module(RUNNER_MODULE[command]), "render", stop_with(signum))
    previous = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(app, [*RUNS[command], "--out", str(out)])
    message = " ".join(result.output.split())
    assert result.exit_code == status, result.output
    assert f"{how} the run finished and {out}/results.json is saved whole, but its report was not drawn" in message
    assert f"sfibench report {out}" in message and "nothing was saved" not in message
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    assert signal.getsignal(signal.SIGTERM) is previous
    saved = digest(out / "results.json")

    monkeypatch.undo()
    result = CliRunner().invoke(app, [*RUNS[command], "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert (out / "report.md").is_file() and digest(out / "results.json") == saved  # drawn, not measured again


@pytest.mark.parametrize("command", list(RUNS))
def test_sigterm_while_the_table_prints_says_the_run_is_whole(tmp_path, monkeypatch, command):
    import importlib

    out = tmp_path / "run"
    monkeypatch.setattr(importlib.import_module(TABLE_MODULE[command]), "terminal_table", stop_with(signal.SIGTERM))
    result = CliRunner().invoke(app, [*RUNS[command], "--out", str(out)])
    assert result.exit_code == 143, result.output
    assert f"terminated (SIGTERM): the run finished and is saved whole in {out}" in " ".join(result.output.split())
    assert {"results.json", "report.md"} <= {p.name for p in out.iterdir()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("finished")
    for command, argv in RUNS.items():
        assert CliRunner().invoke(app, [*argv, "--out", str(root / command)]).exit_code == 0
    return {command: root / command for command in RUNS}


@pytest.mark.parametrize("command, change, named", [
    ("throughput", ["--steps", "5"], "steps (4 there, 5 now)"),
    ("throughput", ["--repeats", "2", "--k-head", "32"], "repeats (1 there, 2 now); sfi.k_head (64 there, 32 now)"),
    ("throughput", ["--methods", "full_kv"], "methods (full_kv/reference,sfi/reference there, full_kv/reference now)"),
    ("throughput", ["--ctx", "320"], "contexts (300 there, 320 now)"),
    ("profile", ["--steps", "3"], "steps (2 there, 3 now)"),
    ("profile", ["--method", "full_kv"], "method (sfi there, full_kv now)"),
    ("profile", ["--batch", "2"], "batch (1 there, 2 now)"),
    ("stability", ["--steps", "9"], "steps (8 there, 9 now)"),
    ("stability", ["--mass", "0.8", "--seed", "3"], "mass (0.9 there, 0.8 now); seed (0 there, 3 now)"),
])
def test_resume_refuses_other_settings_naming_each(finished, command, change, named):
    out = finished[command]
    before = {p.name: digest(p) for p in out.iterdir()}
    result = CliRunner().invoke(app, [*RUNS[command], *change, "--out", str(out), "--resume"])
    one_line_error(result, f"--resume: {out} was run with different {named}", "repeat its settings")
    assert {p.name: digest(p) for p in out.iterdir()} == before


@pytest.mark.parametrize("command", list(RUNS))
def test_resume_needs_a_whole_run_and_does_not_go_with_overwrite(tmp_path, finished, command):
    one_line_error(CliRunner().invoke(app, [*RUNS[command], "--out", str(tmp_path / "none"), "--resume"]),
                   "--resume", "does not exist")
    one_line_error(CliRunner().invoke(app, [*RUNS[command], "--out", str(finished[command]), "--resume",
                                            "--overwrite"]), "give one of them")


def test_quality_resume_refuses_another_batch(tmp_path):
    """--batch sets which prompts share a decode pass: a resumed run with another one would not be the run."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_resume import CLI_RUN  # a tiny quality run, --batch 2

    from sfibench.reporting.results import write_results

    out = tmp_path / "run"
    write_results(out, "quality", {"batch": 2, "model": "tiny-llama"}, {"cells": [], "complete": False})
    before = digest(out / "results.json")
    changed = [*CLI_RUN[:-4], "--batch", "3", *CLI_RUN[-2:]]
    assert CLI_RUN[-4:-2] == ["--batch", "2"]
    result = CliRunner().invoke(app, [*changed, "--out", str(out), "--resume"])
    one_line_error(result, f"--resume: {out} was run with different batch (2 there, 3 now)")
    assert digest(out / "results.json") == before
