"""What every command shares: the consoles, the one way a user error is shown, and shared help texts."""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import io
import math
import os
import signal
import sys
import threading
import typing

import typer
from rich.console import Console

from sfibench.core.errors import RunInterrupted, UsageError, WriteError

console = Console()
err_console = Console(stderr=True)
PATHS = ("reference", "optimized")
PATH_HELP = "reference (plain PyTorch) or optimized (see sfibench/optimized/)"
DEVICE_HELP = "auto, cpu, cuda or cuda:N"
DTYPE_HELP = "auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"


@contextlib.contextmanager
def user_errors():
    """Turn the errors a user can fix into one red line and exit status 2 (no traceback).

    Only errors raised by validation are caught: UsageError and the equally specific classes other
    modules raise, and a write the disk refused (full, over a size or quota limit, read-only, failing).
    Anything else is a bug or an environment failure and keeps its traceback. Ctrl-C prints what was kept
    and exits 130, the shell's status for an interrupt. SIGTERM (what `timeout`, SLURM and Kubernetes send)
    stops the command the same way and exits 143 (128 + SIGTERM). What was kept is read from the run folder
    the command saved last, so a stop after the last write says the run is whole. A standard output closed
    early (`| head`) stops the printing only: the run goes on, and the end says what was kept (exit 1).
    """
    terminated: list[int] = []
    restore = _stop_on_sigterm(terminated)
    forget_saved_run()
    guard, owned = ClosedPipeGuard.install()
    try:
        yield
    except (UsageError, *loaded_user_errors()) as error:  # evaluated once an error is raised
        print_error(error)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt as interrupt:
        kept = str(interrupt) if isinstance(interrupt, RunInterrupted) else kept_by_this_command()
        how = "terminated (SIGTERM)" if terminated else "interrupted"
        err_console.print(f"\n[bold yellow]{how}:[/] {kept}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=128 + signal.SIGTERM if terminated else 130) from None
    except OSError as error:
        if not isinstance(error, WriteError) and error.errno not in WRITE_FAILURES:
            raise
        where = error.filename or "a file"  # a plotting library's write error may not name its file
        fix = WRITE_FIXES.get(error.errno, "make the folder writable, or pass --out DIR where you can write")
        print_error(f"cannot write {where} ({error.strerror}); {kept_by_this_command()}; {fix}")
        raise typer.Exit(code=2) from None
    finally:
        restore()
        if owned:
            guard.remove()
    if owned and guard.closed:  # else the guard's owner (the CLI's entry point) says it once all is printed
        closed_output_notice()
        raise typer.Exit(code=1)  # as Python's own handling of a closed pipe exits


def closed_output_notice() -> None:
    """The one line a command whose standard output was closed early ends with: what it kept."""
    kept = kept_by_this_command()
    if kept == "nothing was saved":
        kept = "the rest of its output was dropped (it saves no run)"
    err_console.print(f"[bold yellow]standard output was closed[/] before sfibench finished printing; {kept}",
                      highlight=False, soft_wrap=True)


# A write the disk refused, each with what frees the way; any other OSError keeps its traceback
WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)
WRITE_FIXES = {errno.ENOSPC: "free some space (or pass --out DIR on another disk) first",
               errno.EDQUOT: "free some of your quota (or pass --out DIR on another disk) first",
               errno.EFBIG: "raise the file-size limit (ulimit -f) first",
               errno.EROFS: "pass --out DIR on a writable disk",
               errno.EIO: "check the disk (an I/O error), or pass --out DIR on another disk"}


def forget_saved_run() -> None:
    results = sys.modules.get("sfibench.reporting.results")  # not loaded: no run was saved
    if results is not None:
        results.forget_saved_run()


def kept_by_this_command() -> str:
    """What the run folder this command saved last holds, and the command that continues from it."""
    results = sys.modules.get("sfibench.reporting.results")
    run_dir = None if results is None else results.last_saved_run()
    if run_dir is None:
        return "nothing was saved"
    from sfibench.reporting.run_files import describe_kept

    return describe_kept(run_dir)


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


SEEDS = (0, 2**63 - 1)  # what every generator a seed reaches accepts (torch's take up to 2**64 - 1)
LARGEST_COUNT = 2**31 - 1  # no count, length or size comes near; beyond, torch's 32-bit index arithmetic wraps


def checked_numbers(command):
    """`command` with every int and float option checked before its body runs: floats finite, ints at most
    LARGEST_COUNT, seeds in SEEDS; typer's own min/max bounds are checked by typer before this. Each refusal
    is one line naming the option, exit 2, as every other bad option."""
    hints = typing.get_type_hints(command)
    numeric = {name: (hints[name], _option_name(name, parameter.default))
               for name, parameter in inspect.signature(command).parameters.items() if hints.get(name) in (int, float)}

    @functools.wraps(command)
    def checked(**values):
        for name, (kind, option) in numeric.items():
            try:
                check_number(values.get(name), kind, option, seed=name == "seed")
            except UsageError as error:
                print_error(error)
                raise typer.Exit(code=2) from None
        return command(**values)

    return checked


def check_number(value, kind, option: str, seed: bool = False) -> None:
    """One numeric option's value (None: left out) against the ranges every such option shares."""
    if value is None:
        return
    if kind is float and not math.isfinite(value):
        raise UsageError(f"{option} {value} is not a finite number; give a number such as 0.5")
    if seed and not SEEDS[0] <= value <= SEEDS[1]:
        raise UsageError(f"{option} {value} is outside 0..{SEEDS[1]} (2**63 - 1); give a whole number in that range")
    if kind is int and not seed and abs(value) > LARGEST_COUNT:
        raise UsageError(f"{option} {value} is larger than any value it can take; give at most {LARGEST_COUNT:,}")


def _option_name(name: str, info) -> str:
    declared = [d for d in getattr(info, "param_decls", None) or () if d.startswith("--")]
    return declared[0] if declared else "--" + name.replace("_", "-")


# The user errors other modules raise that are not UsageErrors, by module. Only the modules already loaded
# are asked: an error of a module not yet imported cannot have been raised, and importing one (torch with it)
# would make a bad command slow to fail.
OTHER_USER_ERRORS = {
    "sfibench.core.device_facts": ("DeviceUnavailableError",),
    "sfibench.engine.prefill": ("PromptError",),
    "sfibench.metrics.memory": ("MemoryEstimateError",),
    "sfibench.metrics.stability": ("StabilityInputError",),
    "sfibench.models.loading": ("MissingWeightsError",),
    "sfibench.models.presets": ("UnknownModelError",),
    "sfibench.workloads.base": ("UnknownTaskError", "ContextSizeError"),
    "sfibench.workloads.longbench": ("LongBenchError",),
}


def loaded_user_errors() -> tuple[type[Exception], ...]:
    return tuple(getattr(sys.modules[module], name) for module, names in OTHER_USER_ERRORS.items()
                 if module in sys.modules for name in names)


def _stop_on_sigterm(terminated: list[int]):
    """Make SIGTERM raise KeyboardInterrupt, so it unwinds like Ctrl-C: each runner saves what is finished
    and says how to continue. Returns what puts the earlier handler back. Python installs handlers only
    from the main thread; elsewhere SIGTERM keeps its earlier meaning."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the save short
        terminated.append(signum)
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, stop)
    # None: a handler installed outside Python, which cannot be put back; the default is the nearest
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def print_error(error: Exception) -> None:
    err_console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)


# Help texts of the SFI settings `generate` and `quality` both take.
NMS_RADIUS_HELP = "SFI: Soft-NMS compares each position with the best score this many positions either side"
NMS_ALPHA_HELP = "SFI: Soft-NMS strength (0 = no suppression)"
EVIDENCE_NORM_HELP = ("SFI ablation: softmax each evidence row over the candidates (SPEC, the authors' Triton "
                      "path) or over every visible key, then restricted to the candidates (their CUDA path)")
KEEP_NEIGHBOURS_HELP = ("SFI ablation beyond the paper: max-pool the Selector's score over this odd number of "
                        "positions before the top-K (after Soft-NMS, or in its place with --no-nms), so a kept "
                        "peak keeps its neighbours; 1 = off")
BRIDGE_STEPS_HELP = "SFI: decode steps after the prompt that read densely before the first selection is used"
PUBLISH_HELP = ("SFI: next_step (each refresh is used from the next step) or when_ready (optimized path on a GPU: "
                "the Selector runs on a side stream and rows read densely until their first selection is "
                "published, the authors' bridge)")
