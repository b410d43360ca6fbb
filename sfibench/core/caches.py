"""Where the libraries sfibench runs keep their caches, so that a read-only HOME changes nothing a user sees.

Triton (compiled kernels), matplotlib (its config and font list), the gemma3-270m package (the GGUF
it assembles from its chunk packages) and sfibench's own part assembly (models/parts.py) each default to a
folder under HOME and fail, or warn on every run, when that folder cannot be written: a read-only home on a cluster node, a container without one.
`use_writable_caches` points each library whose default folder cannot be written at a per-user folder
in the system's temporary directory instead; a variable the user set is left as it is, and where no
folder can be written at all nothing is changed (the library then runs without its cache or says why).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# The variable each library reads for its folder, and the fallback folder's name.
LIBRARY_CACHES = (("TRITON_CACHE_DIR", "triton"), ("MPLCONFIGDIR", "matplotlib"))


def can_write(directory: Path) -> bool:
    """Whether `directory` exists as a writable folder or could be made: its nearest existing ancestor is a
    folder this process may write in. Nothing is created (a probe that creates would itself litter HOME)."""
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


def home() -> Path | None:
    try:
        return Path.home()
    except RuntimeError:  # no HOME and no passwd entry: nothing lives under a home then
        return None


def sfibench_folder(name: str) -> Path | None:
    """~/.cache/sfibench/<name>, where sfibench keeps what it builds once (None without a home)."""
    base = home()
    return None if base is None else base / ".cache" / "sfibench" / name


def fallback_dir(name: str) -> Path | None:
    """`<tmp>/sfibench-<uid>/<name>`, made on first use and only ever used if this user owns it (another
    user could have made the folder first in a shared /tmp); None when it cannot be made."""
    root = Path(tempfile.gettempdir()) / f"sfibench-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        if root.stat().st_uid != os.getuid():
            return None
        directory = root / name
        directory.mkdir(exist_ok=True)
        return directory
    except OSError:
        return None


def cache_dir(default: Path | None, name: str) -> Path | None:
    """`default` where it can be written, else the fallback folder `name` (None: neither can be)."""
    if default is not None and can_write(default):
        return default
    return fallback_dir(name)


def default_dirs(variable: str) -> list[Path] | None:
    """The folders a library writes when `variable` is not set (None: they cannot be known without HOME)."""
    def under(xdg: str, fallback: str) -> Path | None:
        if os.environ.get(xdg):
            return Path(os.environ[xdg])
        base = home()
        return None if base is None else base / fallback

    if variable == "TRITON_CACHE_DIR":  # TRITON_HOME is Triton's switch for the folder .triton lives in
        base = Path(os.environ["TRITON_HOME"]) if os.environ.get("TRITON_HOME") else home()
        return None if base is None else [base / ".triton" / "cache"]
    folders = [under("XDG_CONFIG_HOME", ".config"), under("XDG_CACHE_HOME", ".cache")]  # matplotlib's two
    return None if None in folders else [folder / "matplotlib" for folder in folders]


def use_writable_caches() -> None:
    """Point each library of LIBRARY_CACHES whose default folders cannot be written at a fallback folder."""
    for variable, name in LIBRARY_CACHES:
        if os.environ.get(variable):
            continue
        defaults = default_dirs(variable)
        if defaults is not None and all(can_write(folder) for folder in defaults):
            continue
        fallback = fallback_dir(name)
        if fallback is not None:
            os.environ[variable] = str(fallback)
