"""`sfibench report RUN_DIR`: redraw a run's plots and report.md from its results.json alone.

Each command kind keeps its own renderer beside its runner; this module only picks the one a
results.json names. The file is checked against its schema and the directory checked writable first,
and the renderer draws into a staging folder inside the run: only once every file is drawn do they
replace the old ones, so a file the renderer cannot read, a full disk or Ctrl-C leaves the run as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.reporting.results import RESULTS_FILENAME, InvalidResultsError, remember_run
from sfibench.reporting.run_files import load_run, require_writable

# What a renderer raises on a document its schema let through but that it still cannot read (a value out of
# any range a run writes): turned into one line naming the file instead of a traceback
_UNREADABLE = (KeyError, IndexError, TypeError, AttributeError, ValueError, ZeroDivisionError)


def render(run_dir: Path) -> list[Path]:
    """Regenerate everything derived from `run_dir/results.json`; returns the files written."""
    run_dir = Path(run_dir)
    document = load_run(run_dir, f"sfibench report {run_dir}")
    command = document["command"]
    if command not in RENDERERS:
        raise UsageError(f"{run_dir} holds a `{command}` run, which has no renderer; "
                         f"known: {', '.join(RENDERERS)}")
    require_writable(run_dir, f"sfibench report {run_dir}")
    remember_run(run_dir)  # whole and readable: whatever fails from here on, the run is kept
    with tempfile.TemporaryDirectory(prefix=".sfibench-report.", suffix=".tmp", dir=run_dir) as staging:
        stage = Path(staging)
        try:
            _place(run_dir / RESULTS_FILENAME, stage / RESULTS_FILENAME)  # the renderers read the run's folder
            drawn = RENDERERS[command](stage, document)
        except UsageError:
            raise
        except OSError as error:  # named by the file it would have replaced, not the staging copy
            named = str(error.filename).replace(staging, str(run_dir)) if error.filename else None
            raise OSError(error.errno, error.strerror, named) from None
        except _UNREADABLE as error:
            raise InvalidResultsError(
                f"{run_dir / RESULTS_FILENAME}: a `{command}` report cannot be drawn from it ({type(error).__name__}: "
                f"{error}); the file is damaged or hand-edited: restore it from a copy, or rerun the command that "
                "wrote it into a new --out to regenerate it") from None
        # every file drawn, including any a renderer writes without returning it
        names = list(dict.fromkeys([path.name for path in drawn if path.parent == stage] + sorted(
            entry.name for entry in stage.iterdir() if entry.is_file() and not entry.name.startswith("."))))
        names.remove(RESULTS_FILENAME)
        for name in names:  # renames within one folder: each file is the old one or the new one, never a mixture
            os.replace(stage / name, run_dir / name)
    return [run_dir / name for name in names]


def _place(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # no copy of a large results.json where the file system allows a second name
    except OSError:
        shutil.copyfile(source, target)


def _throughput(run_dir: Path, document: dict) -> list[Path]:
    from sfibench.reporting.results import write_text_atomically
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
