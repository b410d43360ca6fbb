"""A stopped quality run's report states the wall time up to the stop, not up to the last batch that
finished: the time spent on the batch in flight counts too."""

from __future__ import annotations

import time

import pytest
from test_resume import RUN

from sfibench.core.errors import RunInterrupted
from sfibench.reporting.results import read_results
from sfibench.runners import quality_batch
from sfibench.runners.quality import run_quality
from sfibench.commands.quality_options import quality_run

IN_FLIGHT = 0.3  # seconds the interrupted decode pass runs before Ctrl-C


def test_the_wall_time_of_a_stopped_run_counts_the_batch_in_flight(tmp_path, monkeypatch):
    out, decode, calls, saved = tmp_path / "run", quality_batch._decode, [0], {}

    def stopped_at_the_eighth(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 8:  # inside the first task's second batch: earlier batches are saved
            saved["wall_s"] = read_results(out)["results"]["wall_s"]
            time.sleep(IN_FLIGHT)
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(quality_batch, "_decode", stopped_at_the_eighth)
    with pytest.raises(RunInterrupted):
        run_quality(quality_run(**RUN, out=out))
    stopped = read_results(out)["results"]
    # every second after the last save, the pass in flight included, is in the wall time (a lower bound)
    assert stopped["complete"] is False and stopped["wall_s"] >= saved["wall_s"] + IN_FLIGHT
    assert f"wall time {stopped['wall_s'] / 60:.1f} min" in (out / "report.md").read_text()
