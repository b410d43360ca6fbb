"""`sfibench report` and `sfibench check`: redraw runs from results.json, and the regression gate."""

from __future__ import annotations

from pathlib import Path

import typer

from sfibench.commands.common import console, print_error, user_errors
from sfibench.core.errors import UsageError


def report(
    run_dirs: list[Path] = typer.Argument(..., help="run directories, each holding a results.json"),
    out: Path = typer.Option(None, help="several runs: folder for the comparison (default runs/report-<time>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier comparison in --out"),
):
    """Redraw report.md and plots from results.json; several runs of one command side by side, with deltas."""
    from sfibench.reporting.compare import compare_runs
    from sfibench.reporting.report_run import render, terminal_summary
    from sfibench.reporting.results import read_results

    with user_errors():
        if len(run_dirs) == 1:
            if out is not None or overwrite:
                raise UsageError("--out and --overwrite are for comparing several runs; one run is redrawn in place")
            written = render(run_dirs[0])
            for shown in terminal_summary(read_results(run_dirs[0])):
                console.print(shown, highlight=False)
            console.print(f"[green]wrote[/] {', '.join(str(path) for path in written)}", highlight=False)
            return
        run_dir = compare_runs(run_dirs, out, overwrite)
        for shown in terminal_summary(read_results(run_dir)):
            console.print(shown, highlight=False)
        console.print(f"[green]wrote[/] {run_dir}/results.json, report.md and one compare_*.png per metric",
                      highlight=False)


def check(
    baseline: Path = typer.Option(..., help="baseline folder holding baseline.json, e.g. reports/ci"),
    current: Path = typer.Option(None, help="runs to judge, laid out like the baseline (default: rerun the "
                                            "baseline's recorded commands into a temporary folder)"),
    update: bool = typer.Option(False, "--update", help="make the current runs the new baseline (needs --reason)"),
    reason: str = typer.Option(None, help="--update: why the numbers change; recorded with the date"),
    wide: bool = typer.Option(False, "--wide", help="print all columns (default: what fits 80 columns)"),
):
    """Regression gate: compare current runs with a baseline metric by metric; exit 1 on any regression."""
    from sfibench.reporting.check import RerunError, run_check

    with user_errors():
        try:
            status = run_check(baseline, current, update, reason, console, wide)
        except RerunError as error:
            print_error(error)
            raise typer.Exit(code=error.code) from None
    raise typer.Exit(code=status)
