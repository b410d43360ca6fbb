"""A regression baseline: committed runs, how to rerun them, how far each metric may move, and why.

Layout of a baseline directory:

    baseline.json        the manifest (below)
    <run name>/          one run directory per recorded command (results.json, plots, report.md)

The manifest holds, per run, the exact command line (`argv`, without --out) and environment that
produced it, so `sfibench check` can rerun it at the same settings; the tolerance rules (first
matching pattern wins; each says how it was derived); and the history of deliberate updates.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.reporting.results import to_jsonable, write_text_atomically
from sfibench.reporting.run_files import load_run, require_writable
from sfibench.reporting.schema import validate_baseline

MANIFEST = "baseline.json"
FORMAT = 1  # bump when an older sfibench would misread the manifest; load() refuses newer ones


class BaselineError(UsageError):
    """A baseline or a run to compare with it cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move before the gate calls it a regression: absolute, or relative to the
    baseline value; `how` records the measurement it was derived from. A rule with `skip` instead says
    why its metrics are shown but not judged (e.g. timings too noisy on the baseline's machine)."""

    pattern: str
    abs: float | None = None
    rel: float | None = None
    how: str = ""
    skip: str | None = None  # set: the metric is shown but not judged, for this reason

    def allowed(self, baseline_value: float) -> float:
        return self.abs if self.abs is not None else self.rel * abs(baseline_value)

    def describe(self) -> str:
        if self.skip:
            return "not gated"
        return f"±{self.abs:.4g}" if self.abs is not None else f"±{100 * self.rel:.3g}%"


@dataclass
class Baseline:
    directory: Path
    manifest: dict

    @property
    def runs(self) -> dict[str, dict]:
        return self.manifest["runs"]

    def document(self, name: str) -> dict:
        return load_run(self.directory / name, f"baseline run {name!r}")

    def tolerance(self, key: str) -> Tolerance | None:
        for rule in self.manifest.get("tolerances", []):
            if fnmatch.fnmatchcase(key, rule["match"]):
                return Tolerance(rule["match"], rule.get("abs"), rule.get("rel"), rule.get("how", ""), rule.get("skip"))
        return None

    def check_writable(self) -> None:
        """--update rewrites the manifest and every run folder: refuse before any work if it cannot."""
        for directory in [self.directory, *(self.directory / name for name in self.runs)]:
            require_writable(directory, "--update")

    def bless(self, current: dict[str, Path], reason: str, commit: str | None, replaced_commit: str | None) -> None:
        """Make the current runs the baseline and record why (the tolerances stay as derived)."""
        for name, source in current.items():
            _replace_tree(source, self.directory / name)
        self.manifest.setdefault("history", []).append({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "reason": reason,
            "commit": commit, "replaced_commit": replaced_commit, "runs": sorted(current)})
        save_manifest(self.directory, self.manifest)


def load(directory: Path | str) -> Baseline:
    directory = Path(directory)
    if not directory.is_dir():
        raise BaselineError(f"--baseline {directory} is not a directory; give a baseline folder such as reports/ci")
    path = directory / MANIFEST
    if not path.is_file():
        raise BaselineError(f"--baseline {directory} has no {MANIFEST}, so it is not a baseline; give a folder "
                            "such as reports/ci (see reports/ci/README.md for how one is made)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BaselineError(f"{path} is not valid JSON ({error}); restore it from version control") from None
    except OSError as error:
        raise BaselineError(f"{path} cannot be read ({error.strerror}); fix its permissions") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("runs"), dict) or not manifest["runs"]:
        raise BaselineError(f"{path} names no runs (a 'runs' object with at least one entry is needed)")
    if isinstance(manifest.get("format"), int) and manifest["format"] > FORMAT:
        raise BaselineError(f"{path} is baseline format {manifest['format']}, but this sfibench reads up to "
                            f"{FORMAT}; upgrade sfibench to check against it")
    validate_baseline(manifest, path)  # every run's recipe and every tolerance rule, before any is used
    return Baseline(directory, manifest)


def save_manifest(directory: Path, manifest: dict) -> None:
    write_text_atomically(directory / MANIFEST, json.dumps(to_jsonable(manifest), indent=2) + "\n")


def _replace_tree(source: Path, target: Path) -> None:
    """Copy `source` over `target` so that a failure at any point leaves one complete version in place."""
    staged = target.with_name(f".{target.name}.new")
    retired = target.with_name(f".{target.name}.old")
    for leftover in (staged, retired):
        shutil.rmtree(leftover, ignore_errors=True)
    shutil.copytree(source, staged)
    if target.exists():
        target.rename(retired)
    staged.rename(target)
    shutil.rmtree(retired, ignore_errors=True)
