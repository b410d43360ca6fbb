"""Opening an existing run for `report` and `check`: its results.json, and whether it may be rewritten.

Every way a run can be unusable becomes one UsageError naming the folder and what to do, so the CLI
prints one line and exits 2 with nothing changed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.reporting.results import RESULTS_FILENAME, InvalidResultsError, read_results


class RunFilesError(UsageError):
    """A run folder is missing its results.json or cannot be written."""


def load_run(run_dir: Path, what: str) -> dict:
    """A run's results.json; a truncated file, a foreign JSON or a newer schema are read_results' errors."""
    if not Path(run_dir).exists():
        raise RunFilesError(f"{what}: {run_dir} does not exist; give the directory a run wrote (its --out)")
    if not (Path(run_dir) / RESULTS_FILENAME).is_file():
        raise RunFilesError(f"{what}: {run_dir} holds no {RESULTS_FILENAME}; give a run's directory, or rerun "
                            "its command to regenerate it")
    return read_results(run_dir)


def require_writable(directory: Path, what: str) -> None:
    """Create and delete a file there: the only check that sees read-only mounts, permissions and ACLs."""
    try:
        handle, probe = tempfile.mkstemp(prefix=".sfibench-write-check.", dir=directory)
    except OSError as error:
        raise RunFilesError(f"{what}: cannot write in {directory} ({error.strerror}); nothing was changed. "
                            "Copy it somewhere writable, or fix the folder's permissions") from None
    os.close(handle)
    os.unlink(probe)


def describe_kept(run_dir: Path) -> str:
    """What a run folder holds after its command stopped or failed, and the command that continues: a partial
    quality run resumes; a finished run whose report was not drawn (or is older than its results.json) is
    drawn by `sfibench report` or by repeating the command with --resume."""
    results_file = Path(run_dir) / RESULTS_FILENAME
    try:
        document = read_results(run_dir)
    except (InvalidResultsError, OSError):
        return f"nothing whole was saved in {run_dir}"
    results = document["results"]
    if results.get("complete") is False:  # a stopped quality or throughput run
        progress = results.get("progress") or {}
        done = progress.get("results", progress.get("rows", "some"))
        what = "sample results" if document["command"] == "quality" else "measurements"
        return (f"{done} of {progress.get('planned', 'the')} {what} are saved whole in {run_dir}; to continue, "
                f"repeat the command with --out {run_dir} --resume")
    report = Path(run_dir) / "report.md"
    if report.is_file() and report.stat().st_mtime_ns >= results_file.stat().st_mtime_ns:
        return f"the run finished and is saved whole in {run_dir} (results.json, report.md and plots)"
    return (f"the run finished and {results_file} is saved whole, but its report was not drawn: draw it with "
            f"`sfibench report {run_dir}`")


def check_same_settings(recorded: dict, settings: dict, run_dir: Path) -> None:
    """--resume continues only the run its folder holds: every setting given must be the one it recorded,
    and each that is not is named with both values."""
    given, had = _leaves(settings), _leaves(recorded)
    changed = [f"{key} ({_spelled(had.get(key))} there, {_spelled(value)} now)"
               for key, value in given.items() if had.get(key) != value]
    if changed:
        raise RunFilesError(f"--resume: {run_dir} was run with different {'; '.join(changed)}; repeat its settings "
                            "or choose another --out")


def _spelled(value) -> str:
    if isinstance(value, list):
        return ",".join("/".join(map(str, item)) if isinstance(item, list) else str(item) for item in value)
    return "not recorded" if value is None else str(value)


def _leaves(settings: dict, prefix: str = "") -> dict:
    """{'sfi.trigger.t_max': 96, ...}: nested settings by the path of each value."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_leaves(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
