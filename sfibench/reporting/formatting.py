"""How every report and summary spells a measured number and the commit a run came from, and the one
style of the rich tables the commands print (a --wide one printed whole), the cores a CPU run used and
the ranks a run was split over, written once."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def number(value: float | None, digits: int = 3, missing: str = "n/a") -> str:
    """A measured value at fixed precision; `missing` where the run measured none."""
    return missing if value is None else f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    """A share in [0, 1] as a percentage with one decimal."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def styled_table(title: str, columns: tuple[str, ...], right: tuple[str, ...] = ()) -> Table:
    """A rich table in the commands' one style: a rule under the header, no vertical lines, two spaces
    between columns (a boxed table spends three characters per column, which an 80-column terminal
    cannot spare). Columns named in `right` hold numbers and are right-aligned."""
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    return table


def print_table(console: Console, table: Table, wide: bool) -> None:
    """Print a command's result table; `wide` (every column) at the table's own width whatever the terminal:
    rich would otherwise fit it to the console's width (80 columns when the output is a pipe or a file),
    squeezing cells to '…' and cutting each line at that width."""
    if wide:
        table.width = Measurement.get(console, console.options.update_width(10**6), table).maximum
    console.print(table, crop=not wide)


def commit_label(provenance: dict) -> str:
    """'0123456789 (dirty)': the code a run used, as its provenance recorded it; every report spells it so."""
    commit = (provenance.get("git_commit") or "unknown")[:10]
    return commit + (" (dirty)" if provenance.get("git_dirty") else "")


def cpu_threads(prov: dict) -> str:
    """How many of the machine's cores the steps ran on, where the run recorded it."""
    if prov.get("torch_threads") is None:
        return ""
    return (f" on {prov['torch_threads']} torch thread{'s' if prov['torch_threads'] != 1 else ''} of "
            f"{prov.get('cpu_count')} cores (cores busy with other work when the run started are left out: "
            "threads sharing a core stall each other)")


def tensor_parallel_lines(results: dict, measured: str) -> list[str]:
    """A report's line on the ranks a tensor-parallel run split the model over (none for one process);
    `measured`: what of the run is one rank's."""
    tp = results.get("tp", 1)
    if tp == 1:
        return []
    link = f" ({results['interconnect']})" if results.get("interconnect") else ""
    return [(f"- Tensor parallel: tp {tp}{link}: each rank holds 1/{tp} of the attention and KV heads, the MLP "
             f"rows and the LM head's vocabulary; {measured}.")]
