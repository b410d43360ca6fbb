"""Signs of life on standard error while a command waits on something long (loading a model, a prefill, one
method's timed passes): one timestamped line as each such step starts, so a quiet terminal is never a
mystery and a log file shows where a run spent its time. Standard output keeps only results."""

from __future__ import annotations

import os
import time

from rich.console import Console

# resolved at each write, so a captured or redirected stderr (a test's, a log file) receives the lines
_stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def starting(what: str) -> None:
    """'12:03:04 loading smollm2-135m ...' on stderr; a tensor-parallel rank other than 0 stays quiet (rank 0
    speaks for the run)."""
    if os.environ.get("RANK", "0") != "0":
        return
    _stderr.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {what} ...")
