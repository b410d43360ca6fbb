"""Drawing a run's report files without ever leaving a mixture of old and new ones.

The renderer draws into a staging folder inside the run directory (beside the files it replaces, so each
move is a rename on one file system), reading a second name of the run's results.json placed there. Only
once every file is drawn are they renamed over the old ones. A renderer that cannot read the file, a full
disk or Ctrl-C while drawing leaves the run's files as they were, and the staging folder is removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sfibench.core.errors import UsageError, WriteError
from sfibench.reporting.results import RESULTS_FILENAME, InvalidResultsError, remember_run

# What a renderer raises on a document its schema let through but that it still cannot read (a value out of
# any range a run writes): turned into one line naming the file instead of a traceback
_UNREADABLE = (KeyError, IndexError, TypeError, AttributeError, ValueError, ZeroDivisionError)


def draw_staged(run_dir: Path, command: str, draw: Callable[[Path], list[Path]]) -> list[Path]:
    """`draw(stage)` draws a `command` run's report files into `stage`; they then replace the run's own.
    Returns the files written, as paths in `run_dir`."""
    run_dir = Path(run_dir)
    remember_run(run_dir)  # whole and readable: whatever fails from here on, the run is kept
    with tempfile.TemporaryDirectory(prefix=".sfibench-report.", suffix=".tmp", dir=run_dir) as staging:
        stage = Path(staging)
        try:
            _place(run_dir / RESULTS_FILENAME, stage / RESULTS_FILENAME)
            drawn = draw(stage)
        except UsageError:
            raise
        except OSError as error:  # named by the file it would have replaced, not the staging copy
            if error.errno is None:  # not a refusal by the system: keep it as raised
                raise
            named = str(error.filename).replace(staging, str(run_dir)) if error.filename else None
            raise WriteError(error.errno, error.strerror, named) from None
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
