"""The `sfibench` command line: the Typer app, assembled from one module per command (sfibench/commands/).

Each command checks all of its options before any expensive work (model load, bandwidth
measurement, the run itself) and its runner claims the run directory before that work too; a user
error is one red line naming the option and the fix, with exit status 2. docs/ explains the methods,
the reports and how to run; README.md is the short version.
"""

from __future__ import annotations

import typer

from sfibench.commands.closed_output import ClosedPipeGuard
from sfibench.commands.common import METHOD_NAMES, closed_output_notice
from sfibench.commands.generate import generate
from sfibench.commands.info import env, models
from sfibench.commands.numeric_options import checked_numbers
from sfibench.commands.profile import profile
from sfibench.commands.quality import quality
from sfibench.commands.ranks import leave_rank
from sfibench.commands.report import check, report
from sfibench.commands.stability import stability
from sfibench.commands.throughput import throughput
from sfibench.core.caches import use_writable_caches

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help=f"Measure Slow-Fast Inference against the other decoding methods on one engine; methods: "
                       f"{METHOD_NAMES}. Documentation: docs/ in the repository.")
for command in (env, models, generate, stability, quality, throughput, profile, report, check):
    app.command()(checked_numbers(command))  # every numeric option's range, before the command's own checks


@app.callback()
def _writable_caches():
    # Before any command imports Triton or matplotlib: their caches default to folders under HOME.
    use_writable_caches()


def main():  # pragma: no cover - console-script entry
    guard, _ = ClosedPipeGuard.install()  # a closed `| head` drops what is printed, never the run
    try:
        app()
    except SystemExit as done:  # every run ends here: click exits with the command's status
        code = done.code
        if guard.closed and code in (0, None):
            closed_output_notice()
            code = 1  # as Python's own handling of a closed pipe exits
        leave_rank(code)
        raise SystemExit(code) from None
