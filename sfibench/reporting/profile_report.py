"""A `sfibench profile` run drawn from its results.json: the bar chart, report.md and the terminal table."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table

from sfibench.reporting.formatting import commit_label, number, styled_table
from sfibench.reporting.plot_style import save, yerr


def _ordered(result: dict) -> list[tuple[str, float, float | None, float | None]]:
    """(component, ms per step, lowest, highest) by time; the bounds are None for runs that kept no spread."""
    ranges = result.get("ms_per_step_range", {})
    rows = [(name, ms, *ranges.get(name, (None, None))) for name, ms in result["ms_per_step"].items()]
    return sorted(rows, key=lambda row: row[1])


def chart(result: dict, path: Path) -> Path:
    """Horizontal bars: each component's time per step, with its range over the profiled steps."""
    names, values, lows, highs = zip(*_ordered(result))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5), layout="constrained")
    ranged = "ms_per_step_range" in result
    ax.barh(names, values, color="C0", xerr=yerr(list(values), list(lows), list(highs)) if ranged else None,
            capsize=3, error_kw={"elinewidth": 0.8})
    ax.set_xlabel(f"ms per decode step ({result['clock']})")
    ax.set_title(f"{result['method']}/{result['path']} at {result['context']:,} tokens{_batch(result)}, "
                 f"{result['steps']} {'graphed' if result['graphs'] else 'eager'} steps "
                 f"({result['step_kinds'].count('slow')} slow)\n"
                 + ("whiskers: fastest to slowest " + ("timing repeat" if result["graphs"] else "step") if ranged else
                    "no per-step spread recorded (run made before profile kept one)"), fontsize=9)
    save(fig, path)
    return path


def _batch(result: dict) -> str:
    """", B = n" for a run of several sequences (runs before --batch existed decoded one)."""
    return f", B = {result['batch']}" if result.get("batch", 1) > 1 else ""


def markdown(document: dict) -> str:
    result, prov = document["results"], document["provenance"]
    title = f"{result['method']}/{result['path']} at {result['context']:,} tokens{_batch(result)}"
    lines = [f"# sfibench profile: {title}", "",
             f"Model `{document['config']['model']}`, device {prov.get('device')}, torch {prov.get('torch')}, commit "
             f"{commit_label(prov)}, {prov.get('timestamp_utc')}. {result['steps']} "
             f"{'CUDA-graphed' if result['graphs'] else 'eager'} decode steps "
             f"({result['step_kinds'].count('slow')} slow), {result['clock']}.", "",
             "| component | ms per step | fastest step | slowest step |", "|---|---|---|---|"]
    for name, ms, low, high in reversed(_ordered(result)):
        lines.append(f"| {name} | {ms:.3f} | " + (" | ".join(f"{v:.3f}" for v in (low, high)) if low is not None
                                                  else "- | -") + " |")
    wall = result.get("wall_ms_range", (None, None))
    lines += [f"| wall time | {result['wall_ms_per_step']:.3f} | "
              + (" | ".join(f"{v:.3f}" for v in wall) if wall[0] is not None else "- | -") + " |", ""]
    lines += _refresh_lines(result)
    lines += ["![profile](profile.png)", ""]
    return "\n".join(lines)


def _refresh_lines(result: dict) -> list[str]:
    """The optimized SFI's refresh, which the per-step table leaves out: it runs once per slow step (in
    the slow step when synchronous, on the side stream beside the next fast steps when asynchronous)."""
    refresh = result.get("per_refresh_ms")
    if not refresh:
        return []
    by_kind = result.get("step_ms_by_kind", {})
    lines = [f"Per refresh (over {refresh['candidates']:,} candidates per layer and KV head, timed alone, eager, row 0):", "",
             "| part | ms per refresh |", "|---|---|"]
    lines += [f"| {name} | {ms:.3f} |" for name, ms in refresh.items() if name != "candidates"]
    if "slow" in by_kind:
        lines += [f"| a whole slow step of the run above (median) | {by_kind['slow']:.3f} |"]
    return lines + [""]


def terminal_table(document: dict, wide: bool = False) -> Table:
    """Components by time per step, the step's wall time, and the optimized SFI's refresh parts; `wide`
    adds each component's fastest and slowest step (or timing repeat, graphed)."""
    result = document["results"]
    title = (f"sfibench profile: {result['method']}/{result['path']}, {result['context']:,} tokens{_batch(result)}, "
             f"{document['provenance'].get('device')} ({result['clock']}{'' if result['graphs'] else ', eager'})")
    columns = ("component", "ms / step", "fastest", "slowest") if wide else ("component", "ms / step")
    table = styled_table(title, columns, right=columns[1:])
    ranges = {"wall time": tuple(result.get("wall_ms_range", (None, None))), **result.get("ms_per_step_range", {})}
    timed = sorted(result["ms_per_step"].items(), key=lambda kv: -kv[1]) + [("wall time", result["wall_ms_per_step"])]
    for name, ms in timed:
        spread = tuple(number(v, missing="-") for v in ranges.get(name, (None, None)))
        table.add_row(name, f"{ms:.3f}", *(spread if wide else ()))
    for name, ms in result.get("per_refresh_ms", {}).items():  # the optimized SFI's refresh, once per slow step
        table.add_row(f"per refresh: {name}", f"{ms:,.3f}" if name != "candidates" else f"{ms:,}",
                      *(("", "") if wide else ()))
    return table
