"""A `sfibench profile` run drawn from its results.json: the bar chart and the terminal table."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table


def chart(result: dict, path: Path) -> Path:
    names, values = zip(*sorted(result["ms_per_step"].items(), key=lambda kv: kv[1]))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    ax.barh(names, values, color="C0")
    ax.set_xlabel(f"ms per decode step ({result['clock']})")
    ax.set_title(f"{result['method']}/{result['path']} at {result['context']:,} tokens, "
                 f"{result['steps']} {'graphed' if result['graphs'] else 'eager'} steps "
                 f"({result['step_kinds'].count('slow')} slow)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def terminal_table(document: dict) -> Table:
    """Components by time per step, the step's wall time, and the optimized SFI's refresh parts."""
    result = document["results"]
    table = Table(title=f"sfibench profile: {result['method']}/{result['path']}, {result['context']:,} tokens, "
                        f"{document['provenance'].get('device')} "
                        f"({result['clock']}{'' if result['graphs'] else ', eager'})")
    table.add_column("component")
    table.add_column("ms / step", justify="right")
    for name, ms in sorted(result["ms_per_step"].items(), key=lambda kv: -kv[1]):
        table.add_row(name, f"{ms:.3f}")
    table.add_row("wall time", f"{result['wall_ms_per_step']:.3f}")
    for name, ms in result.get("per_refresh_ms", {}).items():  # the optimized SFI's refresh, once per slow step
        table.add_row(f"per refresh: {name}", f"{ms:,.3f}" if name != "candidates" else f"{ms:,}")
    return table
