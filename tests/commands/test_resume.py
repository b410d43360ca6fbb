"""Ctrl-C during `sfibench quality` keeps every finished sample, and --resume completes the run to the
same numbers an uninterrupted run gives (tiny-llama, 600-token prompts: seconds, not minutes)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.errors import RunInterrupted
from sfibench.reporting.results import read_results
from sfibench.runners import quality_batch
from sfibench.runners.quality import run_quality
from sfibench.commands.quality_options import quality_run

# Two tasks x two batches (3 samples, batch 2) x three conditions: an interrupt can land mid-task and mid-batch.
RUN = {"model": "tiny-llama", "methods": ["sfi", "streaming_llm"], "tasks": ["niah_single", "ppl"],
       "contexts": ["600"], "retentions": ["0.5"], "samples": ["3"], "device": "cpu", "chat": False, "batch": 2}
CLI_RUN = ["quality", "--model", "tiny-llama", "--methods", "sfi,streaming_llm", "--tasks", "niah_single,ppl",
           "--ctx", "600", "--retention", "0.5", "--samples", "3", "--no-chat", "--batch", "2", "--device", "cpu"]


def interrupt_at_decode(monkeypatch, number: int) -> list[int]:
    """Make the `number`-th decode pass raise KeyboardInterrupt, as Ctrl-C would; returns the call counter."""
    calls = [0]
    decode = quality_batch._decode

    def counting(*args, **kwargs):
        calls[0] += 1
        if calls[0] == number:
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(quality_batch, "_decode", counting)
    return calls


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return read_results(run_quality(quality_run(**RUN, out=tmp_path_factory.mktemp("whole") / "run")))


def test_interrupted_then_resumed_run_equals_an_uninterrupted_one(tmp_path, monkeypatch, whole):
    out = tmp_path / "run"
    interrupt_at_decode(monkeypatch, 8)  # inside the first task's second batch
    with pytest.raises(RunInterrupted, match="--resume"):
        run_quality(quality_run(**RUN, out=out))
    stopped = read_results(out)
    kept = len(stopped["samples"])
    assert 0 < kept < len(whole["samples"]) and stopped["results"]["complete"] is False
    assert stopped["samples"] == whole["samples"][:kept]  # finished samples are saved, in final order
    assert "Partial run" in (out / "report.md").read_text()  # the report of what is done was rendered

    calls = interrupt_at_decode(monkeypatch, 0)  # count the passes the resumed run needs
    run_quality(quality_run(**RUN, out=out, resume=True))
    resumed = read_results(out)
    assert resumed["results"]["cells"] == whole["results"]["cells"]
    assert resumed["samples"] == whole["samples"] and resumed["results"]["complete"] is True
    assert len(resumed["provenance"]["resumed_from"]) == 1
    assert calls[0] < 12  # an uninterrupted run takes 12 or more passes: finished work was not redone


def test_ctrl_c_on_the_command_line_says_where_things_stand(tmp_path, monkeypatch, whole):
    out = tmp_path / "run"
    interrupt_at_decode(monkeypatch, 5)
    result = CliRunner().invoke(app, [*CLI_RUN, "--out", str(out)])
    assert result.exit_code == 130, result.output
    message = " ".join(result.output.split())
    assert "interrupted:" in message and f"--out {out} --resume" in message
    assert "of 18 sample results are saved" in message

    monkeypatch.undo()
    result = CliRunner().invoke(app, [*CLI_RUN, "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert read_results(out)["results"]["cells"] == whole["results"]["cells"]


def test_ctrl_c_before_anything_finished_leaves_no_directory(tmp_path, monkeypatch):
    out = tmp_path / "run"
    interrupt_at_decode(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        run_quality(quality_run(**RUN, out=out))
    assert not out.exists()
