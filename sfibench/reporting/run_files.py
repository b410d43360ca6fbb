"""Opening an existing run for `report` and `check`: its results.json, and whether it may be rewritten.

Every way a run can be unusable becomes one UsageError naming the folder and what to do, so the CLI
prints one line and exits 2 with nothing changed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.reporting.results import RESULTS_FILENAME, read_results


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
