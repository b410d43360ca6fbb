"""What every command shares: the consoles, the one way a user error is shown, and shared help texts."""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
import threading

import typer
from rich.console import Console

from sfibench import registry
from sfibench.commands.closed_output import ClosedPipeGuard
from sfibench.core.errors import RunInterrupted, UsageError, WriteError

console = Console()
err_console = Console(stderr=True)
PATHS = ("reference", "optimized")
METHOD_NAMES = ", ".join(registry.names())  # every method list in a help text, in the registry's order
PATH_HELP = "reference (plain PyTorch) or optimized (see sfibench/optimized/)"
DEVICE_HELP = "auto, cpu, cuda or cuda:N"
DTYPE_HELP = "auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"
# --threads: the commands that time steps lower torch's count to the idle cores by default (core/device.py)
THREADS_HELP = "torch's CPU threads (default: torch's own count, OMP_NUM_THREADS or else one per core"
TIMED_THREADS_HELP = THREADS_HELP + ", lowered on a CPU to the cores the 1-minute load average leaves idle)"
UNTIMED_THREADS_HELP = THREADS_HELP + ")"


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
