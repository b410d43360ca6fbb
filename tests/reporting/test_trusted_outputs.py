"""What a throughput run shows a reader: one rule for every speedup (table, report.md and the speedup panel
of throughput.png), a noisy run said to be noisy, CPU rows without GPU-only figures, and every plot a
report draws whole on its canvas with no overprinted tick labels."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import matplotlib.figure
import pytest
from plot_bounds import problems
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.reporting import compare, throughput_plots, throughput_report
from sfibench.reporting.report_run import render
from sfibench.reporting.speedup_claims import speedup_claim

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def committed(name: str) -> dict:
    return json.loads((REPORTS / name / "results.json").read_text())


def cpu_run(spreads: float = 0.02) -> dict:
    """The committed CPU throughput run with StreamingLLM at 1K made 2.2x faster than Full-KV while reading
    as many tokens, and every row's passes `spreads` (max-min over median) apart."""
    document = copy.deepcopy(committed("ci/throughput"))
    rows = document["results"]["rows"]
    for row in rows:
        median = row["tokens_per_s"]
        row["tokens_per_s_spread"] = {"min": median * (1 - spreads / 2), "max": median * (1 + spreads / 2),
                                      "rel_spread": spreads}
    full = next(r for r in rows if r["method"] == "full_kv" and r["context"] == 1024)
    fast = next(r for r in rows if r["method"] == "streaming_llm" and r["context"] == 1024)
    fast["tokens_read_mean"] = full["tokens_read_mean"]
    fast["tokens_per_s"] = 2.2 * full["tokens_per_s"]
    fast["tokens_per_s_spread"] = {"min": 2.15 * full["tokens_per_s"], "max": 2.25 * full["tokens_per_s"],
                                   "rel_spread": 0.045}
    return document


def drawn(draw, *args, module=throughput_plots) -> matplotlib.figure.Figure:
    """The figure a plot function of `module` saves, kept open for inspection."""
    figures = []
    original = module.save
    module.save = lambda fig, path: figures.append(fig)
    try:
        draw(*args)
    finally:
        module.save = original
    return figures[0]


def test_a_measured_ratio_of_a_row_reading_every_token_is_shown_marked_and_plotted(tmp_path):
    document = cpu_run()
    rows = document["results"]["rows"]
    fast = next(r for r in rows if r["method"] == "streaming_llm" and r["context"] == 1024)
    claim = speedup_claim(fast, rows)
    assert claim.supported and claim.same_tokens
    cells = {(r["method"], r["context"]): cells[-2] for r, cells in zip(rows, throughput_report.table_rows(rows))}
    assert cells[("streaming_llm", 1024)] == "2.20x (same tokens)" and cells[("full_kv", 1024)] == "ref"
    figure = drawn(throughput_plots.throughput_figure, rows, tmp_path / "throughput.png")
    speedup_panel = figure.axes[1]
    plotted = [(x, y) for line in speedup_panel.lines for x, y in zip(line.get_xdata(), line.get_ydata())]
    assert any(x == 1024 and abs(y - 2.2) < 0.01 for x, y in plotted), "the measured 2.2x is not drawn"
    caption = " ".join(speedup_panel.get_xlabel().split())
    assert "same tokens: streaming_llm/reference at 1,024 read as many tokens" in caption
    report = throughput_report.markdown(document)
    assert "2.20x (same tokens)" in report and "Same tokens: streaming_llm/reference at 1,024" in report


def test_only_separated_spreads_support_a_ratio_on_the_plot(tmp_path):
    """A row reading fewer tokens but with passes overlapping Full-KV's is 'in the noise' everywhere."""
    document = cpu_run(spreads=1.8)
    rows = document["results"]["rows"]
    verdicts = {(r["method"], r["context"]): speedup_claim(r, rows).verdict for r in rows}
    assert verdicts[("sfi", 2048)] == "in the noise"
    figure = drawn(throughput_plots.throughput_figure, rows, tmp_path / "throughput.png")
    filled = [line for line in figure.axes[1].lines if line.get_markerfacecolor() != "none"]
    assert not any(2048 in line.get_xdata() and line.get_marker() not in ("", "None", None) for line in filled)
    assert "has a tok/s range over the timed passes that overlaps" in " ".join(figure.axes[1].get_xlabel().split())


def in_the_noise(document: dict) -> dict:
    """`document` with StreamingLLM's passes at 1K reaching from half Full-KV's speed to past it."""
    rows = document["results"]["rows"]
    full = next(r for r in rows if r["method"] == "full_kv" and r["context"] == 1024)
    fast = next(r for r in rows if r["method"] == "streaming_llm" and r["context"] == 1024)
    fast["tokens_per_s_spread"] = {"min": 0.5 * full["tokens_per_s"], "max": 2.25 * full["tokens_per_s"],
                                   "rel_spread": 1.75 / 2.2}
    return document


def test_runs_side_by_side_draw_only_the_ratios_each_run_supports(tmp_path):
    """`sfibench report A B`: a speedup a run does not support is '= in the noise' in report.md, hollow at 1x
    on the comparison plot with no change drawn under it, and the caption says why."""
    refused, steady = in_the_noise(cpu_run()), in_the_noise(cpu_run())
    rows = compare.side_by_side([refused, steady])
    speedups = [r for r in rows if r["name"] == "speedup_vs_full_kv"]
    fast = next(r for r in speedups if r["series"].startswith("streaming_llm") and r["context"] == 1024)
    assert [p.get("verdict") for p in fast["values"]] == ["in the noise", "in the noise"]
    runs = [{"dir": name, "commit": name, "device": "cpu", "model": "m", "date": "-"} for name in "ab"]
    report = compare.markdown({"config": {"compared_command": "throughput"},
                               "results": {"runs": runs, "rows": rows}}, [])
    line = next(text for text in report.splitlines() if text.startswith(f"| {fast['key']} |"))
    assert line.endswith("| = in the noise | = in the noise |") and "2.2" not in line
    assert "= in the noise: no difference measured, as the row has a tok/s range over the timed passes" in report
    figure = drawn(compare._plot_metric, "speedup_vs_full_kv", speedups, runs, tmp_path, module=compare)
    panel = next(i for i, ax in enumerate(figure.axes) if ax.get_title() == fast["series"])
    top, change = figure.axes[panel], figure.axes[panel + len({r["series"] for r in speedups})]
    points = [(x, y, line.get_markerfacecolor()) for line in top.lines
              for x, y in zip(line.get_xdata(), line.get_ydata()) if y == y]
    near = [(y, face) for x, y, face in points if abs(x / 1024 - 1) < 0.1]
    assert near and all(y == 1.0 and face == "none" for y, face in near), near
    assert not [y for line in change.lines for x, y in zip(line.get_xdata(), line.get_ydata())
                if abs(x / 1024 - 1) < 0.1 and y == y and line.get_marker() == "s"]
    caption = " ".join(figure.legends[0].get_title().get_text().split())
    assert "no difference measured where the row has a tok/s range over the timed passes" in caption
    assert "run 1 streaming_llm/reference B=1 @ 1K" in caption and not problems(figure)


@pytest.mark.parametrize("spreads, noisy", [(1.8, True), (0.04, False)])
def test_a_noisy_run_says_so_once_with_its_spread(spreads, noisy):
    document = cpu_run(spreads)
    report = throughput_report.markdown(document)
    notes = throughput_report.table_notes(document)
    assert report.count("Noisy run") == int(noisy)
    assert sum("Noisy run" in note for note in notes) == int(noisy)
    if noisy:
        assert "±90%" in report and "±90%" in " ".join(notes)


def test_a_cpu_report_has_no_gpu_figures_or_words():
    document = committed("ci/throughput")
    report = throughput_report.markdown(document)
    for word in ("CUDA", "GB/s", "roofline", "NVML", "cuBLAS", "J/token", "peak GiB"):
        assert word not in report, word
    assert "| tok/s |" in report and "| tokens read |" in report
    gpu = throughput_report.markdown(committed("throughput-qwen3-4b-h200"))
    assert "CUDA graphs" in gpu and "| GB/s |" in gpu and "| % roofline |" in gpu


# Committed runs whose plots, between them, are every figure a report draws: a CPU and a GPU throughput
# run, a single-text and a multi-segment stability run (with its head, distance, needle and trigger plots),
# quality runs with tasks and with perplexity, a GPU profile and a comparison of quality runs.
RUNS = ["ci/throughput", "throughput-qwen3-4b-h200", "stability-smollm2", "stability-gemma3-8k", "quality-smollm2",
        "quality-gemma3-8k", "quality-smollm2-ppl", "profile-qwen3-4b-optimized-h200",
        "quality-smollm2-paths/comparison", "quality-qwen2.5-coder-1.5b-niah-list-16k-h100"]
REPORTING = Path(__file__).resolve().parents[2] / "sfibench" / "reporting"


def test_every_plot_is_whole_on_its_canvas(tmp_path, monkeypatch):
    """Each figure the reports draw, checked as it is saved: no text or legend past an edge, no tick labels
    printed over each other. Between them the runs draw every plot file the reporting package names, and
    `sfibench report A B` on two throughput runs draws the comparison panels of speedups and tok/s. (A CPU
    profile's fast and slow panels are checked by test_plots on a real run.)"""
    found, saved = [], set()
    original = matplotlib.figure.Figure.savefig

    def checked(fig, path, *args, **kwargs):
        found.extend(f"{Path(str(path)).parent.name}/{Path(str(path)).name}: {problem}" for problem in problems(fig))
        saved.add(Path(str(path)).name)
        return original(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", checked)
    for name in RUNS:
        run = tmp_path / name.replace("/", "-")
        run.mkdir()
        shutil.copy(REPORTS / name / "results.json", run / "results.json")
        render(run)
    # no committed run holds requests (throughput --prompt-len/--gen-len): a tiny one on the CPU draws their plot
    requests = CliRunner().invoke(app, ["throughput", "--model", "tiny-llama", "--device", "cpu", "--prompt-len",
                                        "400", "--gen-len", "16", "--repeats", "1", "--budget", "96",
                                        "--methods", "full_kv,sfi", "--out", str(tmp_path / "requests")])
    assert requests.exit_code == 0, requests.output
    throughput_runs = []
    for name in ("ci/throughput", "throughput-qwen3-0.6b-h200"):
        throughput_runs.append(tmp_path / f"side-{name.replace('/', '-')}")
        throughput_runs[-1].mkdir()
        shutil.copy(REPORTS / name / "results.json", throughput_runs[-1] / "results.json")
    compare.compare_runs(throughput_runs, tmp_path / "side-by-side", overwrite=False)
    assert not found, "\n".join(found)
    named = {match for source in REPORTING.glob("*.py") for match in re.findall(r"[\"']([a-z_]+\.png)[\"']",
                                                                                  source.read_text())}
    assert named and named <= saved, f"plots no case draws: {sorted(named - saved)}"
    assert {"compare_speedup_vs_full_kv.png", "compare_accuracy.png"} <= saved, sorted(saved)


def test_the_plot_check_sees_overprinted_log_labels():
    """The checker itself: matplotlib's default minor labels on a log axis spanning 20-150 collide."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [20, 150])
    ax.set_yscale("log")
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    assert any("overlap" in problem for problem in problems(fig))
    ax.set_title("a title much too long for a four inch wide figure, running well past both of its edges")
    assert any("outside the canvas" in problem for problem in problems(fig))
    plt.close(fig)


def test_cpu_steps_are_timed_on_the_idle_cores_only(tmp_path, monkeypatch):
    """torch's threads spin-wait on each other at every operator, so a thread sharing a core with other work
    stalls the step (50x on a 2-core machine with one core busy): with one of two cores busy a profile runs
    on one thread and says so in its report, generate decodes on one, and each leaves the process's thread
    count as it was."""
    import torch
    from typer.testing import CliRunner

    from sfibench.cli import app
    from sfibench.core import device
    from sfibench.engine.session import Session

    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(device.os, "getloadavg", lambda: (1.1, 1.0, 0.6))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = tmp_path / "profile"
        result = CliRunner().invoke(app, ["profile", "--ctx", "1500", "--steps", "2", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 2
        assert json.loads((out / "results.json").read_text())["provenance"]["torch_threads"] == 1
        assert "on 1 torch thread of" in (out / "report.md").read_text()
        decoding_threads = []  # generate decodes on the idle cores too (a 2-minute run took 29 s so)
        decode = Session.decode
        monkeypatch.setattr(Session, "decode", lambda *args, **kwargs: decoding_threads.append(
            torch.get_num_threads()) or decode(*args, **kwargs))
        result = CliRunner().invoke(app, ["generate", "--model", "tiny-llama", "--max-new-tokens", "2"])
        assert result.exit_code == 0, result.output
        assert decoding_threads == [1] and torch.get_num_threads() == 2
        monkeypatch.setattr(device.os, "getloadavg", lambda: (0.3, 0.2, 0.1))  # an idle machine: every core
        with device.idle_cores_only(torch.device("cpu")):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    document = committed("ci/throughput")
    document["provenance"].update(torch_threads=1, cpu_count=2)
    assert "on the CPU on 1 torch thread of 2 cores" in throughput_report.markdown(document)
