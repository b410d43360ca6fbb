"""results.json: the one durable record of a run.

Every command writes `RUN_DIR/results.json` holding the schema version, the command, its full
config, provenance (code commit, package versions, hardware, time) and the measured results.
Plots, report.md and `sfibench check` are all derived from this file, so it must be:

- strict JSON (NaN/inf become null; tensors and numpy values become plain numbers and lists),
- never half-written (temp file + os.replace), and
- never silently overwritten (a run directory that already holds results is refused: run_dir.py).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import sys
import tempfile
from pathlib import Path, PurePath
from typing import Any

from sfibench.core.errors import UsageError, WriteError
from sfibench.core.provenance import provenance, sfibench_version
from sfibench.reporting.schema import SchemaError, validate_results

__all__ = [
    "RESULTS_FILENAME",
    "SCHEMA_VERSION",
    "InvalidResultsError",
    "UnsupportedSchemaError",
    "dumps_compactly",
    "read_results",
    "to_jsonable",
    "write_results",
    "write_text_atomically",
]

# Bump when a reader of the old layout would misread the new one; read_results refuses newer files.
SCHEMA_VERSION = 1
RESULTS_FILENAME = "results.json"
_RESERVED_KEYS = ("schema_version", "command", "config", "provenance", "results")


class InvalidResultsError(UsageError):
    """A results.json exists but cannot be used (not JSON, or not shaped like a results file)."""


class UnsupportedSchemaError(InvalidResultsError):
    """A results.json was written by a newer sfibench whose schema this version cannot read."""


# --------------------------------------------------------------------------------------------------
# Writing and reading


def write_results(
    run_dir: Path | str,
    command: str,
    config: Any,
    results: Any,
    extra: dict | None = None,
    *,
    provenance_info: dict | None = None,
) -> Path:
    """Write `run_dir/results.json` atomically and return its path.

    `config` and `results` may hold dataclasses, tensors, numpy values and non-finite floats; all
    are converted to strict JSON. `extra` adds further top-level sections (e.g. raw timings); it may
    not reuse a reserved key. `provenance_info` lets a caller record provenance captured when the
    run started; by default it is collected now.
    """
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "config": config,
        "provenance": provenance() if provenance_info is None else provenance_info,
        "results": results,
    }
    for key, value in (extra or {}).items():
        if key in _RESERVED_KEYS:
            raise ValueError(
                f"extra section {key!r} would replace a reserved results.json key {_RESERVED_KEYS}"
            )
        document[key] = value

    # Serialise fully before touching the disk: a conversion error must leave no file behind.
    text = dumps_compactly(to_jsonable(document)) + "\n"

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / RESULTS_FILENAME
    write_text_atomically(target, text)
    remember_run(run_dir)
    return target


_saved: list[Path] = []  # the run folder whose whole results.json this command last wrote or drew from


def remember_run(run_dir: Path) -> None:
    """This command holds a whole results.json in `run_dir`: a stop or a failure after now has kept it."""
    _saved[:] = [Path(run_dir)]


def last_saved_run() -> Path | None:
    """Where this command last saved (or drew a report from) a whole results.json, if it did."""
    return _saved[0] if _saved else None


def forget_saved_run() -> None:
    """A command starting: nothing it ran is saved yet."""
    _saved.clear()


def write_text_atomically(target: Path, text: str) -> None:
    """Readers (and a Ctrl-C) see either the old complete file or the new one, never a mixture.

    A write that fails (a full disk, a file-size limit, an I/O error) leaves the old file as it was and raises
    OSError; the new file gets the permissions any file the user creates gets (mkstemp's are owner-only).
    """
    # The temp file lives beside the target so os.replace stays a same-filesystem atomic rename.
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:
        raise WriteError(error.errno, error.strerror, str(target)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~current_umask())
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except OSError as error:
        Path(tmp_name).unlink(missing_ok=True)
        if error.errno is None:  # not a refusal by the system: keep it as raised
            raise
        raise WriteError(error.errno, error.strerror, str(target)) from None  # named: a write() error names no file
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else by setting it back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_results(path: Path | str, whole: bool = True) -> dict:
    """Load a results.json, given the file itself or the run directory holding it. Every field its readers
    need is checked (reporting/schema.py); `whole` False checks only that it is an sfibench results file of a
    version this sfibench reads (what deciding whether a folder holds a run needs)."""
    path = Path(path)
    file = path / RESULTS_FILENAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no results file at {file}; pass a run directory containing {RESULTS_FILENAME} "
            f"or the path of a {RESULTS_FILENAME} written by sfibench"
        )
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InvalidResultsError(
            f"{file} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}); "
            f"it may be truncated or hand-edited — rerun the command to regenerate it"
        ) from error
    except UnicodeDecodeError as error:
        raise InvalidResultsError(f"{file} is not UTF-8 text; is it really a {RESULTS_FILENAME}?") from error
    except OSError as error:
        raise InvalidResultsError(f"{file} cannot be read ({error.strerror}); fix its permissions or copy the run "
                                  "somewhere readable") from None

    if not isinstance(document, dict) or not isinstance(document.get("schema_version"), int):
        raise InvalidResultsError(
            f"{file} is JSON but not an sfibench results file (no integer 'schema_version' at the top level)"
        )
    version = document["schema_version"]
    if version > SCHEMA_VERSION:
        raise UnsupportedSchemaError(
            f"{file} uses results schema version {version}, but this sfibench "
            f"({sfibench_version()}) reads versions up to {SCHEMA_VERSION}; upgrade sfibench to read it"
        )
    if not whole:
        return document
    try:
        return validate_results(document, file)
    except SchemaError as error:
        raise InvalidResultsError(str(error)) from None


def dumps_compactly(value: Any, level: int = 0) -> str:
    """Strict JSON, indented by two spaces down to the records and one line per record: a value that nests
    at most two deep (a sample's record, a list of numbers) is written on one line, so a quality run's
    per-step arrays do not take a line per number (half the bytes of a committed report)."""
    if _depth(value) <= 2:
        return json.dumps(value, allow_nan=False)
    inner, pad = "  " * (level + 1), "  " * level
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(key)}: {dumps_compactly(item, level + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    items = [inner + dumps_compactly(item, level + 1) for item in value]
    return "[\n" + ",\n".join(items) + f"\n{pad}]"


def _depth(value: Any) -> int:
    """How deep containers nest in `value`: 0 for a scalar, 1 for a list or dict of scalars."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return 1 + max((_depth(item) for item in value), default=0)
    return 0


# --------------------------------------------------------------------------------------------------
# Conversion to strict JSON


def to_jsonable(value: Any, where: str = "$") -> Any:
    """Convert `value` into plain JSON types; non-finite floats become None.

    `where` tracks the key path so an unsupported type is reported at the place it occurs.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # collapses int subclasses (IntEnum aside, handled below) to plain int
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value, where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value), where)
    if isinstance(value, dict):
        return {_json_key(key, where): to_jsonable(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        # Sorted so the same set always serialises the same way (stable diffs of committed reports).
        return sorted((to_jsonable(item, where) for item in value), key=repr)
    if isinstance(value, PurePath):
        return str(value)

    # Array types are recognised only if their library is already loaded: a value cannot be a
    # tensor unless torch was imported, and this keeps reporting usable without importing torch.
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return to_jsonable(value.detach().cpu().tolist(), where)
        if isinstance(value, (torch.dtype, torch.device)):
            return str(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            return to_jsonable(value.tolist(), where)
        if isinstance(value, numpy.generic):
            return to_jsonable(value.item(), where)
    raise TypeError(f"cannot write {type(value).__name__} at {where} to results.json; convert it first")


def _json_key(key: Any, where: str) -> str:
    if isinstance(key, str):
        return key
    # Scalars (including numpy scalars and enums) become their JSON spelling, as json.dumps would.
    plain = to_jsonable(key, where)
    if isinstance(plain, str):
        return plain
    if plain is None or isinstance(plain, (bool, int, float)):
        return json.dumps(plain)
    raise TypeError(f"cannot use a {type(key).__name__} as a results.json key at {where}")
