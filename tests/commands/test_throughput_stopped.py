"""A throughput run stopped (Ctrl-C or SIGTERM) after its first measurement keeps it: results.json holds the
finished row, marked partial, report.md covers it, the message says how to continue, and `--resume` measures
only the rows the run lacks, keeping the finished one as it was. The signal is sent from inside the process
when the second measurement starts, as `timeout` would send it from outside."""

from __future__ import annotations

import json
import os
import signal

import pytest
from tiny_runs import TINY_RUNS
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.runners import throughput_measure

# two shapes of two methods: four measurements, two prefills
ARGV = [*TINY_RUNS["throughput"][:-4], "--ctx", "200,300", "--methods", "full_kv,sfi", "--k-head", "64"]


@pytest.mark.parametrize("signum, status, how", [(signal.SIGINT, 130, "interrupted:"),
                                                  (signal.SIGTERM, 143, "terminated (SIGTERM):")])
def test_a_stop_after_the_first_measurement_keeps_it_and_resume_measures_the_rest(tmp_path, monkeypatch,
                                                                                  signum, status, how):
    measure, calls = throughput_measure.measure, []

    def stopped_at_the_second(*args, **kwargs):
        calls.append(args[2].name)  # the method spec
        if len(calls) == 2:
            os.kill(os.getpid(), signum)  # delivered to the command's handler, as from outside
        return measure(*args, **kwargs)

    monkeypatch.setattr(throughput_measure, "measure", stopped_at_the_second)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*ARGV, "--out", str(out)])
    message = " ".join(result.output.split())
    assert result.exit_code == status, result.output
    assert f"{how} stopped; 1 of 4 measurements" in message and f"--out {out} --resume" in message, message
    assert "nothing was saved" not in message and "Traceback" not in result.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["results"]["complete"] is False and saved["results"]["progress"] == {"rows": 1, "planned": 4}
    [first] = saved["results"]["rows"]
    assert (first["method"], first["context"]) == ("full_kv", 200)
    report = (out / "report.md").read_text()
    assert "Stopped early (partial)" in report and "| full_kv | reference | 200 |" in report

    calls.clear()
    monkeypatch.setattr(throughput_measure, "measure",
                        lambda *args, **kwargs: calls.append(args[2].name) or measure(*args, **kwargs))
    result = CliRunner().invoke(app, [*ARGV, "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert calls == ["sfi", "full_kv", "sfi"]  # the finished row is not measured again
    resumed = json.loads((out / "results.json").read_text())
    rows = resumed["results"]["rows"]
    assert resumed["results"]["complete"] is True and len(rows) == 4
    assert [(r["method"], r["context"]) for r in rows] == [("full_kv", 200), ("sfi", 200), ("full_kv", 300),
                                                            ("sfi", 300)]
    assert rows[0]["tokens_per_s"] == first["tokens_per_s"]  # kept as it was measured
    assert "resumed_from" in resumed["provenance"] and "Stopped early" not in (out / "report.md").read_text()


def test_a_stop_before_any_measurement_finished_leaves_nothing(tmp_path, monkeypatch):
    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(throughput_measure, "measure", stopped)
    result = CliRunner().invoke(app, [*ARGV, "--out", str(tmp_path / "run")])
    assert result.exit_code == 130 and "nothing was saved" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "run").exists()
