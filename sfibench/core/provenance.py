"""Provenance: where and with what a result was produced (commit, versions, device, host, time).

Every probe is best effort: an unknown fact is None, never an exception, because losing a run's
results over a provenance detail would be worse than a blank field.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from sfibench.core.device import cpu_model, gpu_driver_version

__all__ = ["DEVICE_COMMIT", "device_name", "provenance", "sfibench_version"]


DEVICE_COMMIT = "DEVICE_COMMIT"  # written beside the package before a copy of the tree runs elsewhere


def provenance() -> dict:
    """Where and with what a result was produced. Never raises: unknown facts are None."""
    root = Path(__file__).resolve().parents[1].parent
    commit, dirty = _recorded_commit(root / DEVICE_COMMIT)
    source = DEVICE_COMMIT if commit else "git"
    if not commit:
        commit, dirty = _git_state(root / "sfibench")
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "git_commit_source": source,
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "triton": _package_version("triton"),
        "transformers": _package_version("transformers"),
        "sfibench": sfibench_version(),
        "device": device_name(),
        "cuda": _cuda_version(),
        "gpu_driver": gpu_driver_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),  # the run's own while it writes (device.idle_cores_only)
        "hostname": socket.gethostname(),
        "timestamp_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _recorded_commit(path: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) from a DEVICE_COMMIT file: `git rev-parse HEAD` then `git status --short`.

    A tree copied to another machine (the lent GPU) may carry a stale .git or none, so the commit is
    recorded on the machine that has the real one just before the copy; this file then wins."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None, None
    if not lines or len(lines[0].strip()) != 40:
        return None, None
    changed = [line for line in lines[1:] if line[:2].strip() and not line.startswith("??")]
    return lines[0].strip(), bool(changed)


def _git_state(package_dir: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout holding the sfibench package directory, or (None, None)."""

    def git(*args: str) -> str:
        completed = subprocess.run(
            ["git", "-C", str(package_dir), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return completed.stdout.strip()

    try:
        # Only trust a repository whose root directly contains the package: an installed copy in
        # site-packages may sit inside some unrelated repository whose commit would be misleading.
        toplevel = Path(git("rev-parse", "--show-toplevel")).resolve()
        if toplevel != package_dir.parent:
            return None, None
        commit = git("rev-parse", "HEAD")
        # Untracked files (run outputs, caches) do not change the code that ran, so they are ignored.
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        return commit, dirty
    except (OSError, subprocess.SubprocessError, ValueError):
        return None, None


def _package_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def sfibench_version() -> str | None:
    # Prefer the module attribute: an editable checkout may be ahead of its installed metadata.
    try:
        import sfibench

        return getattr(sfibench, "__version__", None) or _package_version("sfibench")
    except ImportError:
        return _package_version("sfibench")


def device_name() -> str:
    """The device results are measured on, as provenance records it: the GPU's name, or "cpu"."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.cuda.current_device())
    except (ImportError, RuntimeError, AssertionError):
        # torch reports a broken driver or CUDA init failure this way; it must not cost the run its
        # results file, and a device torch cannot use is not the device that produced the numbers.
        return "cpu"
    return "cpu"


def _cuda_version() -> str | None:
    try:
        import torch

        return torch.version.cuda
    except ImportError:
        return None
