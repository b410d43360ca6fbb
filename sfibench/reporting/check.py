"""`sfibench check`: judge current runs against a baseline, print the verdicts, say pass or fail.

With no current runs given, the baseline's recorded commands are rerun at their recorded settings
(command line and environment from baseline.json) into a fresh temporary folder, each in its own
process through the public CLI, so the gate depends on the commands and results.json only. Every
input is checked before any rerun: the baseline's manifest and runs, the --current runs, and with
--update that the baseline can be written. The rerun folder is kept and printed, so a result is never
lost and can be blessed later with --current.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sfibench.core.provenance import device_name
from sfibench.reporting.baseline import Baseline, BaselineError, load
from sfibench.reporting.formatting import commit_label, print_table, styled_table
from sfibench.reporting.gate import Verdict, compare
from sfibench.reporting.results import RESULTS_FILENAME
from sfibench.reporting.run_files import load_run
from sfibench.reporting.run_metrics import Metric, device_identity

STYLES = {"ok": "green", "improved": "cyan", "regressed": "bold red", "changed": "bold red", "missing": "bold red",
          "non-finite": "bold red", "skipped": "yellow", "untracked": "dim", "new": "dim"}
LOG_WIDTH = 180


class RerunError(Exception):
    """A recorded command did not finish; `code` is 2 when it refused its input, else 1 (a regression)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def run_check(baseline_dir: Path, current_dir: Path | None, update: bool, reason: str | None,
              console: Console, wide: bool = False) -> int:
    """Exit status: 0 pass (or blessed with --update), 1 any regression. `wide`: the full verdict table."""
    if update and not (reason and reason.strip()):
        raise BaselineError("--update needs --reason TEXT saying why the new numbers are the right ones")
    if reason and not update:
        raise BaselineError("--reason only goes with --update (it is recorded when a baseline is replaced)")
    with log_width(console):
        return _check(baseline_dir, current_dir, update, reason, console, wide)


@contextmanager
def log_width(console: Console):
    """Where the console writes to a log (not a terminal), at least LOG_WIDTH columns wide inside the block, so
    no metric name is cut; afterwards as it was, since the commands share one console for the whole process."""
    if console.is_terminal:
        yield
        return
    # rich keeps a width given to it in `_width` (None: measured from the environment at each print), and has
    # no public way back to None
    given = console._width
    console.width = max(console.width, LOG_WIDTH)
    try:
        yield
    finally:
        console._width = given


def _check(baseline_dir: Path, current_dir: Path | None, update: bool, reason: str | None, console: Console,
           wide: bool) -> int:
    """run_check's work, its --update and --reason already checked."""
    baseline = load(baseline_dir)
    baseline_docs = {name: baseline.document(name) for name in baseline.runs}
    if update:
        baseline.check_writable()
    if current_dir is None:
        elsewhere = _recorded_elsewhere(baseline_docs, device_name())
        if update and elsewhere:
            raise BaselineError(f"--update reruns every run of {baseline.directory}, but {', '.join(elsewhere)} "
                                "need another device; update it there, or give --current DIR with runs made on one")
        for name, device in elsewhere.items():
            console.print(f"[yellow]skipped[/] {name}: recorded on {device} and this machine is {device_name()}; "
                          "its command needs that device, so none of its metrics is judged here (run the check "
                          "there, or give --current DIR with runs made on one)", highlight=False, soft_wrap=True)
        if len(elsewhere) == len(baseline.runs):
            console.print(f"[yellow]SKIPPED[/]: no run of {baseline.directory} can be rerun on this machine",
                          highlight=False)
            return 0
        baseline_docs = {name: doc for name, doc in baseline_docs.items() if name not in elsewhere}
        current_dir = Path(tempfile.mkdtemp(prefix="sfibench-check-"))
        current = rerun(baseline, current_dir, console, list(baseline_docs))
    else:
        current = _locate(Path(current_dir), baseline)
    current_docs = {name: load_run(path, f"current run {name!r}") for name, path in current.items()}
    verdicts = [v for name in baseline_docs for v in compare(name, baseline_docs[name], current_docs[name], baseline)]
    _print(verdicts, baseline_docs, current_docs, console, wide)
    if update:
        replaced = next(iter(baseline_docs.values()))["provenance"].get("git_commit")
        baseline.bless(current, reason.strip(), next(iter(current_docs.values()))["provenance"].get("git_commit"),
                       replaced)
        console.print(f"[green]blessed:[/] {baseline.directory} now holds these runs; the reason is recorded in "
                      f"{baseline.directory / 'baseline.json'}", highlight=False)
        return 0
    failed = sum(v.failed for v in verdicts)
    if failed:
        console.print(f"[bold red]FAIL:[/] {failed} of {len(verdicts)} metrics regressed, changed, went missing or "
                      f"became non-finite "
                      f"(current runs in {current_dir}). If the change is intended, bless it: sfibench check "
                      f"--baseline {baseline.directory} --current {current_dir} --update --reason TEXT",
                      highlight=False, soft_wrap=True)
        return 1
    console.print(f"[green]PASS[/] (current runs in {current_dir})", highlight=False)
    return 0


def _print(verdicts: list[Verdict], baseline_docs: dict, current_docs: dict, console: Console, wide: bool) -> None:
    """Where each side ran, the table, then each failure again on one line so a long log ends with them."""
    for label, docs in (("baseline", baseline_docs), ("current", current_docs)):
        prov = next(iter(docs.values()))["provenance"]
        console.print(f"{label}: commit {commit_label(prov)}, {prov.get('timestamp_utc')}, {device_identity(prov)}",
                      highlight=False)
    print_table(console, table(verdicts, wide), wide)
    notes: dict[tuple[str, str], int] = {}
    for v in verdicts:
        if v.note:
            notes[(v.verdict, v.note)] = notes.get((v.verdict, v.note), 0) + 1
    for (verdict, note), count in notes.items():  # once each, not on every row
        console.print(f"{count} {verdict}: {note}", highlight=False, soft_wrap=True)
    for v in verdicts:
        if v.failed:
            console.print(f"[{STYLES[v.verdict]}]{v.verdict}[/]: {v.key}: {format_metric(v.baseline)} -> "
                          f"{format_metric(v.current)} (tolerance {v.tolerance.describe() if v.tolerance else 'none'})",
                          highlight=False, soft_wrap=True)
    counts = {state: sum(v.verdict == state for v in verdicts) for state in STYLES}
    console.print(", ".join(f"{n} {state}" for state, n in counts.items() if n), highlight=False)


def rerun(baseline: Baseline, workdir: Path, console: Console, names: list[str]) -> dict[str, Path]:
    """Run the recorded commands of `names` into workdir/<name>; returns the run directories."""
    runs = {}
    for name in names:
        recipe = baseline.runs[name]
        out = workdir / name
        argv = [*recipe["argv"], "--out", str(out)]
        console.print(f"rerunning {name}: sfibench {' '.join(argv)}", highlight=False, soft_wrap=True)
        began = time.perf_counter()
        completed = subprocess.run([sys.executable, "-m", "sfibench", *argv], check=False, capture_output=True, text=True,
                                   env={**os.environ, **recipe.get("env", {})}, stdin=subprocess.DEVNULL)
        if completed.returncode != 0:
            tail = "\n".join(completed.stderr.strip().splitlines()[-15:])
            raise RerunError(f"rerunning {name!r} failed with exit status {completed.returncode}:\n{tail}",
                             2 if completed.returncode == 2 else 1)
        console.print(f"  {name}: {time.perf_counter() - began:.0f} s", highlight=False)
        runs[name] = out
    return runs


def _recorded_elsewhere(baseline_docs: dict, here: str) -> dict[str, str]:
    """Runs recorded on a GPU other than this machine's device (name -> that GPU): their commands cannot be
    rerun here, or would measure another device. A CPU run reruns on any machine."""
    recorded = {name: doc["provenance"].get("device") for name, doc in baseline_docs.items()}
    return {name: device for name, device in recorded.items() if device not in (None, "cpu", here)}


def _locate(current_dir: Path, baseline: Baseline) -> dict[str, Path]:
    """--current is laid out like the baseline (a folder per run), or is the run itself for a one-run baseline."""
    names = list(baseline.runs)
    if (current_dir / RESULTS_FILENAME).is_file():
        if len(names) > 1:
            raise BaselineError(f"--current {current_dir} is one run, but the baseline has {len(names)} "
                                f"({', '.join(names)}); give a folder holding one subfolder per run")
        return {names[0]: current_dir}
    if not current_dir.is_dir():
        raise BaselineError(f"--current {current_dir} is not a directory")
    missing = [name for name in names if not (current_dir / name).is_dir()]
    if missing:
        raise BaselineError(f"--current {current_dir} has no {', '.join(missing)} folder; lay it out like the "
                            f"baseline, one folder per run ({', '.join(names)}), each holding its results.json")
    return {name: current_dir / name for name in names}


def table(verdicts: list[Verdict], wide: bool = False) -> Table:
    """One row per metric. Compact: metrics grouped under their run and subject (a metric key is
    run/subject/metric; whole keys are too long for an 80-column terminal beside their values), each with
    its baseline and current value. `wide`: whole keys, intervals, delta and tolerance."""
    if wide:
        grid = styled_table("sfibench check", ("metric", "baseline", "current", "delta", "tolerance", "verdict"),
                            right=("baseline", "current", "delta", "tolerance"))
        for v in verdicts:
            delta = "" if v.baseline is None or v.current is None else _delta(v.baseline, v.current)
            grid.add_row(v.key, format_metric(v.baseline), format_metric(v.current), delta,
                         v.tolerance.describe() if v.tolerance else "", f"[{STYLES[v.verdict]}]{v.verdict}[/]")
        return grid
    grid = styled_table("sfibench check", ("metric", "baseline", "current", "verdict"), right=("baseline", "current"))
    heading = ("", "")
    for v in verdicts:
        run, rest = escape(v.key).split("/", 1)
        subject, _, metric = rest.rpartition("/")
        if (run, subject) != heading:
            if run != heading[0]:
                grid.add_row(f"[bold]{run}[/]")
            if subject:
                grid.add_row(f"  {subject}")
            heading = (run, subject)
        grid.add_row(f"    {metric}" if subject else f"  {metric}", format_metric(v.baseline, interval=False),
                     format_metric(v.current, interval=False), f"[{STYLES[v.verdict]}]{v.verdict}[/]")
    return grid


def format_metric(metric: Metric | None, interval: bool = True) -> str:
    if metric is None:
        return "-"
    if metric.value is None:
        return "n/a"
    text = f"{metric.value:.4g}"
    if interval and metric.low is not None and metric.high is not None:
        text += f" [{metric.low:.3g}, {metric.high:.3g}]"
    return text


def _delta(baseline: Metric, current: Metric) -> str:
    if baseline.value is None or current.value is None:
        return ""
    return f"{current.value - baseline.value:+.4g}"
