"""`--wide` prints every column whole whatever the terminal: piped to a file (no terminal, where rich would
fit the table to 80 columns) each table line is the line the same table draws with no width limit, so no
cell is cut to '…', wrapped or cropped. Without `--wide` the 80-column tables of test_terminal_width.py
stand."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.commands.info import models_table
from sfibench.reporting import throughput_report
from sfibench.reporting.baseline import load
from sfibench.reporting.check import table as check_table
from sfibench.reporting.formatting import print_table
from sfibench.reporting.gate import compare

ROOT = Path(__file__).resolve().parents[2]
CI_BASELINE = ROOT / "reports" / "ci"


def unlimited(table) -> list[str]:
    """The table's lines drawn on a console wider than any table."""
    console = Console(width=1000, file=io.StringIO(), record=True)
    console.print(table)
    return [line.rstrip() for line in console.export_text().splitlines() if line.strip()]


def assert_whole(printed: str, table) -> None:
    lines = unlimited(table)
    assert max(map(len, lines)) > 80  # a table an 80-column console would have to cut
    assert "…" not in printed
    shown = [line.rstrip() for line in printed.splitlines()]
    assert lines[0] in shown, printed  # the title, or the header where the table has none
    start = shown.index(lines[0])
    assert shown[start:start + len(lines)] == lines


def test_models_wide_piped_to_a_file_prints_every_column():
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([sys.executable, "-m", "sfibench", "models", "--wide"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # stdout a pipe
    assert done.returncode == 0, done.stderr
    assert_whole(done.stdout, models_table(wide=True)[0])


def test_check_wide_prints_every_column_of_the_verdicts():
    result = CliRunner().invoke(app, ["check", "--baseline", str(CI_BASELINE), "--current", str(CI_BASELINE),
                                      "--wide"])
    assert result.exit_code == 0, result.output
    baseline = load(CI_BASELINE)
    docs = {name: baseline.document(name) for name in baseline.runs}
    verdicts = [v for name, doc in docs.items() for v in compare(name, doc, doc, baseline)]
    assert_whole(result.output, check_table(verdicts, wide=True))


def test_a_wide_throughput_table_is_whole_on_an_80_column_console_and_a_compact_one_fits_it():
    document = json.loads((CI_BASELINE / "throughput" / "results.json").read_text())
    for wide in (True, False):
        out = io.StringIO()
        print_table(Console(width=80, file=out), throughput_report.terminal_table(document, wide), wide)
        if wide:
            assert_whole(out.getvalue(), throughput_report.terminal_table(document, wide))
        else:
            assert max(map(len, out.getvalue().splitlines())) <= 80
