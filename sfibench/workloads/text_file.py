"""A user's text file (`--text-file`, `--prompt-file`), read with one clear error for each way it can fail."""

from __future__ import annotations

from pathlib import Path

from sfibench.core.errors import UsageError


def read_text_file(path: Path | str, option: str) -> str:
    """The file's text; missing, a directory, unreadable, not UTF-8 or blank are each named."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{option} {path} does not exist; give the path of a text file")
    if not path.is_file():
        raise UsageError(f"{option} {path} is not a file (a directory?); give the path of a text file")
    try:
        text = path.read_text(encoding="utf-8")
    except PermissionError:
        raise UsageError(f"{option} {path} cannot be read (permission denied)") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path} is not UTF-8 text; give a plain-text file") from None
    if not text.strip():
        raise UsageError(f"{option} {path} is empty; give a file with some text")
    return text
