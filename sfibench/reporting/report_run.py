"""`sfibench report RUN_DIR`: redraw a run's plots and report.md from its results.json alone.

Each command kind keeps its own renderer beside its runner; this module only picks the one a
results.json names. The file is checked against its schema and the directory checked writable first,
and the renderer draws into a staging folder (staging.py): only once every file is drawn do they replace
the old ones, so a file the renderer cannot read, a full disk or Ctrl-C leaves the run as it was.
"""

from __future__ import annotations

from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.reporting.results import read_results
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.reporting.run_files import check_same_settings, load_run, require_writable
from sfibench.reporting.staging import draw_staged


def render(run_dir: Path) -> list[Path]:
    """Regenerate everything derived from `run_dir/results.json`; returns the files written."""
    run_dir = Path(run_dir)
    document = load_run(run_dir, f"sfibench report {run_dir}")
    command = document["command"]
    if command not in RENDERERS:
        raise UsageError(f"{run_dir} holds a `{command}` run, which has no renderer; "
                         f"known: {', '.join(RENDERERS)}")
    require_writable(run_dir, f"sfibench report {run_dir}")
    return draw_staged(run_dir, command, lambda stage: RENDERERS[command](stage, document))


def finish_saved_run(out: Path | None, command: str, settings: dict) -> Path:
    """`--resume` on a run whose results.json is whole (its command saves once, at the end): nothing is measured
    again; the run's recorded settings must be the ones given now, and its report is drawn from the file."""
    with claimed_run_dir(out, command, resume=True) as run_dir:
        check_same_settings(read_results(run_dir)["config"], settings, run_dir)
        render(run_dir)
    return run_dir


def _throughput(run_dir: Path, document: dict) -> list[Path]:
    from sfibench.reporting.results import write_text_atomically
    from sfibench.reporting import throughput_requests_report as requests

    if requests.is_request_run(document):
        write_text_atomically(run_dir / "report.md", requests.markdown(document))
        return [requests.plot(document["results"]["rows"], run_dir / requests.PLOT), run_dir / "report.md"]
    from sfibench.reporting.throughput_plots import plot
    from sfibench.reporting.throughput_report import markdown

    plots = plot(document["results"]["rows"], run_dir)
    write_text_atomically(run_dir / "report.md", markdown(document))
    return [*plots, run_dir / "report.md"]


def _quality(run_dir: Path, document: dict) -> list[Path]:
    from sfibench.reporting.quality_report import write_report

    report = write_report(run_dir)
    return [*sorted(run_dir.glob("*.png")), report]


def _stability(run_dir: Path, document: dict) -> list[Path]:
    from sfibench.reporting.stability_markdown import write_report
    from sfibench.reporting.stability_plots import write_plots

    plots = write_plots(run_dir, document["results"])
    write_report(run_dir, document)
    return [*plots, run_dir / "report.md"]


def _profile(run_dir: Path, document: dict) -> list[Path]:
    from sfibench.reporting.profile_report import chart, markdown
    from sfibench.reporting.results import write_text_atomically

    write_text_atomically(run_dir / "report.md", markdown(document))
    return [chart(document["results"], run_dir / "profile.png"), run_dir / "report.md"]


def _comparison(run_dir: Path, document: dict) -> list[Path]:
    from sfibench.reporting.compare import render_comparison

    report = render_comparison(run_dir)
    return [*sorted(run_dir.glob("compare_*.png")), report]


RENDERERS = {"throughput": _throughput, "quality": _quality, "stability": _stability, "profile": _profile,
             "report": _comparison}


def terminal_summary(document: dict, wide: bool = False) -> list:
    """What the command that made the run prints when it finishes (its table, and the notes under it), so
    `sfibench report RUN` shows the result, not only the files it wrote."""
    command, results = document["command"], document["results"]
    if command == "throughput":
        from sfibench.reporting import throughput_requests_report as requests
        from sfibench.reporting.throughput_report import table_notes, terminal_table

        if requests.is_request_run(document):
            return [requests.terminal_table(document, wide), *requests.table_notes(document)]

        return [terminal_table(document, wide), *table_notes(document)]
    if command == "quality":
        from sfibench.reporting.quality_report import results_table

        return [results_table(results["cells"], wide)]
    if command == "stability":
        from sfibench.reporting.stability_markdown import terminal_table

        return [terminal_table(document, wide)]
    if command == "profile":
        from sfibench.reporting.profile_report import terminal_table

        return [terminal_table(document, wide)]
    from sfibench.reporting.compare import terminal_tables

    return terminal_tables(document)
