"""Standard output closed early (`sfibench throughput ... | head -1`): the printing stops, never the run.

The guard stands in for sys.stdout from the CLI's entry point on (and around each command where the CLI is
called in-process); the command's own user_errors() and the entry point say what was kept once it is done.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys


class ClosedPipeGuard:
    """Stands in for sys.stdout while a command runs: once the reader of a pipe has gone (EPIPE), what is
    printed is dropped (the descriptor is pointed at /dev/null, so Python's own flush at exit is quiet too)
    and the command carries on, so a finished run is never lost to a closed `| head`."""

    def __init__(self, stream):
        self._stream = stream
        self.closed = False

    @classmethod
    def install(cls) -> tuple[ClosedPipeGuard, bool]:
        """(the guard standing in for sys.stdout, whether this call put it there): one already there is kept."""
        if isinstance(sys.stdout, cls):
            return sys.stdout, False
        guard = cls(sys.stdout)
        sys.stdout = guard
        return guard, True

    def remove(self) -> None:
        if sys.stdout is self:
            sys.stdout = self._stream

    def write(self, text: str) -> int:
        if not self.closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
