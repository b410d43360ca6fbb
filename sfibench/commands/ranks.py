"""`--tp N`: a command run as N tensor-parallel ranks, one process each, launched by torchrun.

Given `--tp N` outside a torchrun launch, the command starts itself again under torchrun (the line it runs
is printed, for a cluster's own launcher) and exits with torchrun's status; torchrun ends every rank when
one fails. Inside the launch, rank 0 alone prints (and, in the commands that write one, writes the run
directory). Torch-free, so a bad `--tp` fails before torch loads.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import typer

from sfibench.commands.common import err_console
from sfibench.core.errors import UsageError

TP_HELP = ("tensor-parallel ranks: the model's KV heads split over N processes (N GPUs, or N CPU processes), "
           "started with torchrun; every method on either path, without CUDA graphs")


def check_tp(tp: int, graphs: bool = False) -> None:
    """What runs under tensor parallelism: every method on either path, each rank's kernels on its own KV
    heads, without CUDA graphs."""
    if tp > 1 and graphs:
        raise UsageError(f"--tp {tp} runs without CUDA graphs; use --no-graphs, or --tp 1")


def torchrun_line(tp: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}",
            "-m", "sfibench", *sys.argv[1:]]


def run_as_ranks(tp: int) -> None:
    """Call after the command's options are checked, before any model loads. Outside torchrun with tp > 1:
    run the command under torchrun and exit with its status. Inside: check the launch has tp ranks and
    silence every rank but 0."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and tp == 1:
        return
    if world == 1:
        line = torchrun_line(tp)
        shown = ["torchrun", *line[3:]]
        err_console.print(f"[dim]running {tp} ranks: {shlex.join(shown)}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(subprocess.call(line))
    if world != tp:
        raise UsageError(f"--tp {tp} asks for {tp} ranks but torchrun started {world}; give torchrun "
                         f"--nproc-per-node={tp}, or leave torchrun out and let --tp start it")
    if os.environ.get("RANK", "0") != "0":  # stdout goes nowhere; a rank's traceback still reaches stderr
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
        err_console.quiet = True


def leave_rank(code) -> None:
    """A tensor-parallel rank (launched by torchrun) ends here with the command's status, its output flushed,
    without running the interpreter's teardown: torch's process-group objects destroyed during that teardown
    can abort a rank whose work is done ("terminate called without an active exception", or a segfault),
    which torchrun reports as the run failing. One process (no torchrun) returns and exits normally."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return
    if code is not None and not isinstance(code, int):  # sys.exit("message"): the message, status 1
        print(code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))
