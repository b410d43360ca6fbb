"""Run directories: where a command writes, checked before the work and left clean if it fails.

A run directory holds one command's results.json and what is derived from it (plots, report.md).
Before any expensive work, `claimed_run_dir` makes sure the place can take the run: not a file, not on
a read-only file system, not a folder of the user's own files, not an earlier run unless --overwrite
(or --resume) says so. It then creates the directory; if the command fails or is stopped before it
saved anything, the directories it created are removed again, so a failed run leaves nothing behind.

A claimed directory is held, for as long as the run lasts, by an exclusive lock on a file in it (flock,
which the kernel releases when the process dies, however it dies). Of two runs started at once for one
--out, one takes the lock and proceeds; the other is refused, and a run that takes the lock checks the
directory again under it, so one that started while another was writing sees that run's results.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.reporting.results import RESULTS_FILENAME, InvalidResultsError, read_results

DEFAULT_ROOT = Path("runs")
_OWN_TEMP_FILE = re.compile(r"\..+\.tmp")  # what an atomic write leaves if the process is killed mid-way
RESUMABLE = ("quality", "throughput", "profile", "stability")  # the commands with --resume
LOCK_NAME = ".sfibench.lock"  # held while a run writes; left behind only by a run killed outright


class RunDirError(UsageError):
    """--out (or the default runs/) cannot take this run; the message says why and what to do."""


class RunDirExistsError(RunDirError, FileExistsError):
    """The run directory already holds a results.json and overwriting was not requested."""


class RunDirIsFileError(RunDirError, NotADirectoryError):
    """--out names an existing file."""


class RunDirBusyError(RunDirError):
    """Another run holds the run directory's lock: it is writing there now."""


def make_run_dir(out: Path | str | None, command: str, overwrite: bool = False) -> Path:
    """Create (or reuse) the directory a run writes into, after the checks described above.

    With `out` None the directory is `runs/<command>-<UTC timestamp>`, suffixed `-2`, `-3`, ... when
    two runs start in the same second. Use `claimed_run_dir` where a failure should remove it again.
    """
    return _claim(out, command, overwrite, resume=False)[0]


@contextlib.contextmanager
def claimed_run_dir(out: Path | str | None, command: str, *, overwrite: bool = False,
                    resume: bool = False) -> Iterator[Path]:
    """The checked, created run directory; removed again (if this call created it) when the body
    raises, Ctrl-C included, before anything was written into it.

    `resume` asks for an existing run of `command` to continue: it must hold that run's results.json.
    """
    run_dir, created = _claim(out, command, overwrite, resume)
    lock = None
    try:
        lock = _lock(run_dir)
        if out is not None:  # a run that held the lock until now may have written here since the check
            _check_existing(run_dir, command, overwrite, resume)
        yield run_dir
    except BaseException:
        _unlock(run_dir, lock)
        for directory in reversed(created):  # innermost first; stop at the first one holding anything
            try:
                directory.rmdir()
            except OSError:
                break
        raise
    _unlock(run_dir, lock)


def _lock(run_dir: Path) -> int:
    """An open descriptor of run_dir's lock file, exclusively locked by this process."""
    path = run_dir / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise RunDirError(f"--out {run_dir}: cannot create {path.name} there ({error.strerror}); "
                              "pass --out DIR on a writable disk") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirBusyError(f"run directory {run_dir} is being written by another sfibench run (process "
                                  f"{holder}); wait for it to finish, or choose another --out") from None
        except OSError:  # a file system without locks (some network mounts): the checks are all there is
            return fd
        # The holder before us unlinks the file as it finishes: a lock on that unlinked file guards nothing,
        # so take the lock again on the file now at the path.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            return fd
        os.close(fd)


def _unlock(run_dir: Path, fd: int | None) -> None:
    if fd is None:
        return
    with contextlib.suppress(OSError):
        (run_dir / LOCK_NAME).unlink()  # before releasing: see the inode check in _lock
    os.close(fd)


def _claim(out: Path | str | None, command: str, overwrite: bool, resume: bool) -> tuple[Path, list[Path]]:
    """(run directory, the directories created for it, outermost first)."""
    if out is None:
        if resume:
            raise RunDirError("--resume needs --out DIR, the folder of the run to continue")
        return _claim_default(command)
    run_dir = Path(out)
    if run_dir.is_dir():
        _check_existing(run_dir, command, overwrite, resume)
        _check_writable(run_dir, f"--out {run_dir}")
        return run_dir, []
    if run_dir.exists():
        raise RunDirIsFileError(f"--out {run_dir} is a file, not a directory; choose another --out")
    if resume:
        raise RunDirError(f"--resume: {run_dir} does not exist; give the --out of the run to continue")
    missing = [run_dir, *(parent for parent in run_dir.parents if not parent.exists())]
    existing = run_dir.parents[len(missing) - 1]
    if not existing.is_dir():
        raise RunDirError(f"--out {run_dir}: {existing} is a file, so no folder can be made inside it; "
                          "choose another --out")
    _check_writable(existing, f"--out {run_dir}")
    created = [directory for directory in reversed(missing) if _mkdir(directory, f"--out {run_dir}")]
    return run_dir, created


def _claim_default(command: str) -> tuple[Path, list[Path]]:
    created = []
    where = f"the default run directory {DEFAULT_ROOT}/ in {Path.cwd()}"
    if not DEFAULT_ROOT.is_dir():
        if DEFAULT_ROOT.exists():
            raise RunDirError(f"{where} is a file; remove it or pass --out DIR")
        _check_writable(Path.cwd(), where)
        if _mkdir(DEFAULT_ROOT, where):
            created.append(DEFAULT_ROOT)
    _check_writable(DEFAULT_ROOT, where)
    # Compact timestamp: sortable, and free of ':' which some filesystems reject.
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = DEFAULT_ROOT / f"{command}-{stamp}"
    suffix = 1
    while True:
        candidate = base if suffix == 1 else base.with_name(f"{base.name}-{suffix}")
        try:
            # mkdir without exist_ok claims the name atomically, so concurrent runs cannot share it.
            candidate.mkdir()
            return candidate, [*created, candidate]
        except FileExistsError:
            suffix += 1


def _check_existing(run_dir: Path, command: str, overwrite: bool, resume: bool) -> None:
    """An existing --out may be empty, or hold an earlier run of this command that --overwrite or
    --resume asks for; anything else is refused, so no user file is ever overwritten or mixed in."""
    if not (run_dir / RESULTS_FILENAME).exists():
        if resume:
            raise RunDirError(f"--resume: {run_dir} holds no {RESULTS_FILENAME} to continue; "
                              "drop --resume to start a new run, or give the --out of the stopped run")
        try:
            foreign = [entry.name for entry in run_dir.iterdir()
                       if entry.name != LOCK_NAME and not _OWN_TEMP_FILE.fullmatch(entry.name)]
        except OSError as error:
            raise RunDirError(f"--out {run_dir} cannot be read ({error.strerror}); choose another --out") from None
        if foreign:
            raise RunDirError(f"--out {run_dir} is not empty and holds no sfibench run (it has {foreign[0]!r}); "
                              "sfibench would write among your files, so choose a new or empty folder "
                              "(--overwrite replaces only an earlier sfibench run)")
        return
    try:
        earlier = read_results(run_dir, whole=resume)  # only a run to continue must be readable throughout
    except InvalidResultsError as error:
        raise RunDirError(f"--out {run_dir}: {error}; move that file away or choose another --out") from None
    if earlier.get("command") != command:
        raise RunDirError(f"--out {run_dir} holds a `{earlier.get('command')}` run, not a `{command}` run; "
                          "choose another --out")
    if not (overwrite or resume):
        continuing = ", --resume to continue it" if command in RESUMABLE else ""
        raise RunDirExistsError(f"run directory {run_dir} already contains {RESULTS_FILENAME} from an earlier "
                                f"run; pass --overwrite to replace it{continuing}, or choose another --out")


def _check_writable(directory: Path, what: str) -> None:
    """Create and delete a file there: the only check that sees read-only mounts, ACLs and full disks."""
    try:
        handle, name = tempfile.mkstemp(prefix=".sfibench-write-check.", suffix=".tmp", dir=directory)
    except OSError as error:
        raise RunDirError(f"{what}: cannot write in {directory} ({error.strerror}); "
                          "pass --out DIR on a writable disk") from None
    os.close(handle)
    os.unlink(name)


def _mkdir(directory: Path, what: str) -> bool:
    """Whether this call created `directory` (a concurrent run may have made it in the meantime)."""
    try:
        directory.mkdir()
        return True
    except FileExistsError:
        return False
    except OSError as error:
        raise RunDirError(f"{what}: cannot create {directory} ({error.strerror}); "
                          "pass --out DIR on a writable disk") from None
