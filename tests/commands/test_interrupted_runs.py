"""A run that is raced or interrupted loses nothing: of two runs racing for one folder exactly one writes,
and SIGTERM saves and renders what finished, says how to resume, and a resumed run is the whole run."""

from __future__ import annotations

import json
import os

import pytest
import torch
from refusals import one_line_error
from typer.testing import CliRunner

from sfibench.cli import app

# ------------------------------------------------------------------------------------------ racing runs

def claim_and_write(out: str, name: str, claimed, attempted, outcomes) -> None:
    """One of two racing runs: claim `out`; the one that gets it writes its results.json only once the
    other has tried too, so the other meets the folder mid-run, where the race used to be lost."""
    from sfibench.reporting.results import write_results
    from sfibench.reporting.run_dir import RunDirError, claimed_run_dir

    try:
        with claimed_run_dir(out, "quality") as run_dir:
            claimed.set()
            attempted.wait(timeout=120)  # only a deadlock guard: both holding the folder would hang here
            write_results(run_dir, "quality", {"run": name}, {"cells": []})
        outcomes.put((name, "wrote"))
    except RunDirError as error:
        outcomes.put((name, f"refused: {error}"))
        attempted.set()


@pytest.mark.parametrize("start", ["together", "one after the other claims"])
def test_of_two_runs_racing_for_one_folder_exactly_one_writes(tmp_path, start):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    claimed, attempted, go = context.Event(), context.Event(), context.Event()
    outcomes = context.Queue()
    out = str(tmp_path / "run")

    def racer(name: str):
        def run():
            go.wait(timeout=120)
            if name == "second" and start != "together":
                claimed.wait(timeout=120)
            claim_and_write(out, name, claimed, attempted, outcomes)
        return context.Process(target=run)

    processes = [racer("first"), racer("second")]
    for process in processes:
        process.start()
    go.set()
    for process in processes:
        process.join(timeout=300)
    results = dict(outcomes.get(timeout=10) for _ in processes)
    wrote = [name for name, outcome in results.items() if outcome == "wrote"]
    refused = [outcome for outcome in results.values() if outcome.startswith("refused")]
    assert len(wrote) == 1 and len(refused) == 1, results
    assert "another sfibench run" in refused[0] or "already contains results.json" in refused[0], refused
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"] == {"run": wrote[0]}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["results.json"]  # the lock is gone


def test_a_run_started_while_another_writes_the_folder_is_refused_by_the_cli(tmp_path, monkeypatch):
    from sfibench.reporting.run_dir import claimed_run_dir

    monkeypatch.chdir(tmp_path)
    with claimed_run_dir(tmp_path / "run", "stability"):
        result = CliRunner().invoke(app, ["stability", "--model", "tiny-llama", "--out", "run"])
    one_line_error(result, "being written by another sfibench run", f"process {os.getpid()}", "--out")
    assert list((tmp_path / "run").iterdir()) == []


# --------------------------------------------------------------------------------------------- SIGTERM

# The quality run of test_resume.py, in a process of its own whose 5th decode pass (of 12 or more; 18
# sample results in all) waits for a signal: the test sends SIGTERM once it is there, as `timeout` would.
WAIT_AT_DECODE = """
import signal, sys
from pathlib import Path
from sfibench.runners import quality_batch
from sfibench.cli import app

decode, calls = quality_batch._decode, [0]

def waiting(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 5:
        Path(sys.argv[1]).write_text("waiting")
        while True:
            signal.pause()
    return decode(*args, **kwargs)

quality_batch._decode = waiting
app(sys.argv[2:])
"""


def test_sigterm_saves_renders_says_how_to_resume_and_resuming_gives_the_whole_run(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from test_resume import CLI_RUN, RUN

    from sfibench.reporting.results import read_results
    from sfibench.runners.quality import run_quality
    from sfibench.commands.quality_options import quality_run

    out, marker = tmp_path / "run", tmp_path / "waiting"
    # The child decodes with this process's torch thread count: a CPU reduction's order, and so its last bits,
    # follow the thread count, and the resumed cells are compared with the whole run's for equality.
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    process = subprocess.Popen([sys.executable, "-c", WAIT_AT_DECODE, str(marker), *CLI_RUN, "--out", str(out)],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not marker.exists() and process.poll() is None:  # waits for a state, asserts no duration
            time.sleep(0.2)
        assert marker.exists(), process.communicate()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    message = " ".join(stderr.split())
    assert "terminated (SIGTERM):" in message and f"--out {out} --resume" in message, message
    assert "Traceback" not in stderr
    stopped = read_results(out)
    assert 0 < len(stopped["samples"]) < 18 and stopped["results"]["complete"] is False
    assert "Partial run" in (out / "report.md").read_text()

    result = CliRunner().invoke(app, [*CLI_RUN, "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    whole = read_results(run_quality(quality_run(**RUN, out=tmp_path / "whole")))
    resumed = read_results(out)
    assert resumed["results"]["cells"] == whole["results"]["cells"] and resumed["samples"] == whole["samples"]


def test_sigterm_before_anything_finished_leaves_nothing_and_exits_143(tmp_path, monkeypatch):
    import signal

    from test_resume import CLI_RUN

    from sfibench.runners import quality_batch

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this process's handler, as from outside
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(quality_batch, "_decode", terminated)
    previous = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(app, [*CLI_RUN, "--out", str(tmp_path / "run")])
    assert result.exit_code == 143, result.output
    assert "terminated (SIGTERM): nothing was saved" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()
    assert signal.getsignal(signal.SIGTERM) is previous  # the command put the earlier handler back
