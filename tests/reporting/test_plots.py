"""Plots a reader can trust: every measured curve carries its spread (stability runs here; throughput and
comparison plots draw theirs from the timed passes), and the stability reducer's intervals are right."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import BarContainer, ErrorbarContainer
from plot_bounds import problems

from sfibench.core.budget import Budget
from sfibench.metrics.stability import Mean, StabilityConfig
from sfibench.metrics.stability_reducer import StabilityReducer
from sfibench.reporting import stability_plots
from sfibench.sfi.config import SFIConfig


def test_mean_keeps_the_95_percent_interval_of_its_samples():
    samples = [0.2, 0.5, 0.4, 0.9]
    scalar, binned = Mean(), Mean(3)
    for value in samples:
        scalar.add(torch.tensor(value))
        binned.add(torch.tensor(value), 1)
    expected = 1.96 * np.std(samples, ddof=1) / np.sqrt(len(samples))
    assert float(scalar.ci95()) == pytest.approx(expected)
    assert float(binned.ci95()[1]) == pytest.approx(expected)
    assert torch.isnan(binned.ci95()[0]) and torch.isnan(binned.ci95()[2])  # no samples: no interval


@pytest.fixture(scope="module")
def results() -> dict:
    """A reducer fed random attention for 60 steps, a sentence every 6 steps (only its summary is plotted)."""
    generator = torch.Generator().manual_seed(0)
    cfg = StabilityConfig(topk_frac=0.05, k_head=Budget(tokens=20), max_offset=8,
                          sfi=SFIConfig(n_sink=2, n_recent=16, page=4))
    reducer = StabilityReducer(cfg, 3, num_kv_heads=2)
    for step in range(60):
        length = 80 + step
        reducer.update(torch.randn(3, 2, 2, length, generator=generator) * 2,
                       torch.rand(3, 2, length, generator=generator) + 0.5, sentence_start=step % 6 == 0)
    return {"model": "random", "mode": "teacher-forced", **reducer.summary()}


@pytest.mark.parametrize("draw", [stability_plots._offset_plot, stability_plots._split_plot])
def test_every_stability_curve_has_error_bars(results, draw):
    figure = draw(results)
    with_bars = [c for ax in figure.axes for c in ax.containers if isinstance(c, ErrorbarContainer) and c.has_yerr]
    caps = {id(cap) for container in with_bars for cap in container.lines[1]}
    curves = [line for ax in figure.axes for line in ax.lines  # lines with markers are measured points
              if line.get_marker() not in (None, "None", "") and id(line) not in caps]
    bars = [c for ax in figure.axes for c in ax.containers if isinstance(c, BarContainer)]
    measured_bars = [bar for bar in bars if bar.errorbar is not None]  # the others count sentences
    plt.close(figure)
    assert curves and len(with_bars) == len(curves) + len(measured_bars)
    if draw is stability_plots._split_plot:
        assert bars and measured_bars == bars
    for container in with_bars:  # bars of real length, not zeros standing in for a missing interval
        segments = [s for collection in container.lines[2] for s in collection.get_segments()]
        assert any(abs(s[1][1] - s[0][1]) > 0 for s in segments)


def test_profile_keeps_each_components_spread_over_the_steps_and_draws_it(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from sfibench.cli import app
    from sfibench.reporting import profile_report
    from sfibench.reporting.profile_report import chart
    from sfibench.reporting.results import read_results

    out = tmp_path / "profile"
    result = CliRunner().invoke(app, ["profile", "--ctx", "1500", "--steps", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = read_results(out)["results"]
    for name, (low, high) in saved["ms_per_step_range"].items():
        assert low <= saved["ms_per_step"][name] + 1e-9 and saved["ms_per_step"][name] <= high + 1e-9, name
    assert saved["wall_ms_range"][0] <= saved["wall_ms_per_step"] <= saved["wall_ms_range"][1]
    assert "| attention |" in (out / "report.md").read_text()
    drawn = []
    monkeypatch.setattr(profile_report, "save", lambda figure, path: drawn.append(figure))
    chart(saved, tmp_path / "profile.png")
    assert len(drawn[0].axes) == 2  # a panel per step kind: SFI's fast step and its slow step
    for ax in drawn[0].axes:
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == 1 and bars[0].has_xerr
    FigureCanvasAgg(drawn[0])  # save() closed the figure, taking its canvas; draw it as it was saved
    assert not problems(drawn[0])  # whole on its canvas, tick labels apart


def test_profile_report_shows_the_refresh_parts_only_when_the_run_timed_them():
    from sfibench.reporting.profile_report import markdown

    result = {"method": "sfi", "path": "optimized", "context": 4096, "steps": 8, "step_kinds": ["fast"] * 7 + ["slow"],
              "ms_per_step": {"weights GEMMs (floor chain)": 2.0, "attention kernels": 0.4},
              "wall_ms_per_step": 2.6, "clock": "CUDA-graph replays, fast step", "graphs": True,
              "step_ms_by_kind": {"fast": 2.6, "slow": 5.25}}
    document = {"results": result, "config": {"model": "tiny-llama"}, "provenance": {"device": "test"}}
    assert "Per refresh" not in markdown(document)
    result["per_refresh_ms"] = {"selector": 1.5, "publish + compact rebuild": 0.25, "candidates": 3000}
    text = markdown(document)
    assert "| selector | 1.500 |" in text and "| publish + compact rebuild | 0.250 |" in text
    assert "3,000 candidates" in text and "| a whole slow step of the run above (median) | 5.250 |" in text
