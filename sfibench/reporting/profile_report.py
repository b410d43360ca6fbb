"""A `sfibench profile` run drawn from its results.json: the bar chart, report.md and the terminal table.

An eager run profiles a step of every kind its method has (`by_kind`: SFI's fast step and its slow
step with the Selector); each kind gets its own bars and column, holding only the components that ran
in it. A graphed run (the optimized path on a GPU) times one step kind part by part.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table

from sfibench.reporting.formatting import commit_label, cpu_threads, number, styled_table, tensor_parallel_lines
from sfibench.reporting.plot_style import save, wrapped, yerr


def kinds(result: dict) -> dict[str, dict]:
    """Step kind -> its components (ms_per_step, ms_per_step_range, wall_ms_per_step, wall_ms_range); one
    kind for a run that profiled only its main step."""
    if "by_kind" in result:
        return result["by_kind"]
    main = result.get("main_kind") or ("fast" if "fast" in result.get("step_ms_by_kind", {}) else "step")
    return {main: {key: result[key] for key in ("ms_per_step", "ms_per_step_range", "wall_ms_per_step", "wall_ms_range")
                   if key in result}}


def _ordered(part: dict) -> list[tuple[str, float, float | None, float | None]]:
    """(component, ms per step, lowest, highest) by time; the bounds are None for runs that kept no spread."""
    ranges = part.get("ms_per_step_range", {})
    rows = [(name, ms, *ranges.get(name, (None, None))) for name, ms in part["ms_per_step"].items()]
    return sorted(rows, key=lambda row: row[1])


def _step_count(result: dict, kind: str) -> int:
    return result["step_kinds"].count(kind) if kind in result["step_kinds"] else result["steps"]


def chart(result: dict, path: Path) -> Path:
    """Horizontal bars per step kind: each component's time per step, with its range over the profiled steps."""
    parts = kinds(result)
    heights = [0.45 * len(part["ms_per_step"]) + 1.0 for part in parts.values()]
    fig, axes = plt.subplots(len(parts), 1, figsize=(8, sum(heights) + 1.2), layout="constrained", squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (kind, part) in zip(axes[:, 0], parts.items()):
        names, values, lows, highs = zip(*_ordered(part))
        ranged = "ms_per_step_range" in part
        ax.barh(names, values, color="C1" if kind == "slow" else "C0", capsize=3, error_kw={"elinewidth": 0.8},
                xerr=yerr(list(values), list(lows), list(highs)) if ranged else None)
        steps = _step_count(result, kind)
        ax.set_title(f"{kind} step ({steps} profiled; wall {part['wall_ms_per_step']:.2f} ms)", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(wrapped(f"ms per decode step ({result['clock']})", 90), fontsize=8)
    whiskers = ("whiskers: fastest to slowest " + ("timing repeat" if result["graphs"] else "profiled step")
                if "ms_per_step_range" in next(iter(parts.values())) else "no per-step spread recorded")
    fig.suptitle(wrapped(f"{result['method']}/{result['path']} at {result['context']:,} tokens{_batch(result)}, "
                         f"{'graphed' if result['graphs'] else 'eager'} steps; {whiskers}", 90), fontsize=9)
    save(fig, path)
    return path


def _batch(result: dict) -> str:
    """", B = n" for a run of several sequences (runs before --batch existed decoded one)."""
    return f", B = {result['batch']}" if result.get("batch", 1) > 1 else ""


def markdown(document: dict) -> str:
    result, prov = document["results"], document["provenance"]
    title = f"{result['method']}/{result['path']} at {result['context']:,} tokens{_batch(result)}"
    counts = ", ".join(f"{_step_count(result, kind)} {kind}" for kind in kinds(result))
    lines = [f"# sfibench profile: {title}", "",
             f"Model `{document['config']['model']}`, device {prov.get('device')}"
             + (cpu_threads(prov) if prov.get("device") == "cpu" else "") + f", torch {prov.get('torch')}, commit "
             f"{commit_label(prov)}, {prov.get('timestamp_utc')}. {result['steps']} "
             f"{'CUDA-graphed' if result['graphs'] else 'eager'} decode steps profiled ({counts}), {result['clock']}.",
             ""]
    ranks = tensor_parallel_lines(result, "the components are rank 0's share of each step")
    lines += [*ranks, ""] if ranks else []
    for kind, part in kinds(result).items():
        if len(kinds(result)) > 1:
            lines += [f"## {kind} step", ""]
        lines += ["| component | ms per step | fastest step | slowest step |", "|---|---|---|---|"]
        for name, ms, low, high in reversed(_ordered(part)):
            lines.append(f"| {name} | {ms:.3f} | " + (" | ".join(f"{v:.3f}" for v in (low, high)) if low is not None
                                                      else "- | -") + " |")
        wall = part.get("wall_ms_range", (None, None))
        lines += [f"| wall time | {part['wall_ms_per_step']:.3f} | "
                  + (" | ".join(f"{v:.3f}" for v in wall) if wall[0] is not None else "- | -") + " |", ""]
    lines += _unprofiled_lines(result, prov.get("device"))
    lines += _refresh_lines(result)
    lines += ["![profile](profile.png)", ""]
    return "\n".join(lines)


def profiler_cost(result: dict) -> list[tuple[str, float, float, int]]:
    """(kind, profiled wall ms, the same kind's median step without the profiler, steps in that median) for
    an eager run that timed its steps both ways."""
    unprofiled, counts = result.get("step_ms_by_kind", {}), result.get("unprofiled_steps_by_kind", {})
    if "by_kind" not in result:
        return []
    return [(kind, part["wall_ms_per_step"], unprofiled[kind], counts.get(kind, 0))
            for kind, part in result["by_kind"].items() if kind in unprofiled]


def _unprofiled_lines(result: dict, device: str | None) -> list[str]:
    """How the profiled steps compare with the same steps run without the profiler, and with a throughput
    run's figure for the same step kind; a method kind the search did not meet is named."""
    cost = profiler_cost(result)
    lines = []
    if cost:
        lines += ["Without the profiler (a first pass over the same teacher-forced tokens from the same prefill, "
                  f"{result.get('searched_steps', 0)} steps), the median step took: "
                  + "; ".join(f"{kind} {plain:.3f} ms over {n} step{'s' if n != 1 else ''} against {profiled:.3f} ms profiled"
                              for kind, profiled, plain, n in cost) + ". "
                  "The difference is the profiler's own cost (it records every operator, which lengthens each "
                  "component in proportion to the operators it launches) plus whatever else the machine was "
                  "doing; the components are shares of the profiled step, and the unprofiled median is the figure "
                  "to compare with a throughput run's `ms fast/dense` and `ms slow` at the same context"
                  + (", which on a GPU replays CUDA graphs and so also saves the launch gaps shown here."
                     if device != "cpu" else ", which times the same eager steps."), ""]
    missing = result.get("kinds_missing") or []
    if missing:
        lines += [f"No {' or '.join(missing)} step came within the {result.get('searched_steps')} steps searched, "
                  "so none is profiled.", ""]
    return lines


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
    """Components by time per step, one column per step kind profiled, then the step's wall time profiled
    and without the profiler; `wide` adds the main kind's fastest and slowest step (or timing repeat,
    graphed). The optimized SFI's refresh parts follow."""
    result = document["results"]
    parts = kinds(result)
    title = (f"sfibench profile: {result['method']}/{result['path']}, {result['context']:,} tokens{_batch(result)}, "
             f"{document['provenance'].get('device')} ({result['clock']}{'' if result['graphs'] else ', eager'})")
    named = [f"{kind} ms" if len(parts) > 1 else "ms / step" for kind in parts]
    columns = ("component", *named, *(("fastest", "slowest") if wide else ()))
    table = styled_table(title, columns, right=columns[1:])
    first = next(iter(parts.values()))
    order = list(dict.fromkeys(name for part in parts.values()
                               for name, *_ in reversed(_ordered(part))))
    for name in order:
        spread = tuple(number(v, missing="-") for v in first.get("ms_per_step_range", {}).get(name, (None, None)))
        table.add_row(name, *(f"{part['ms_per_step'][name]:.3f}" if name in part["ms_per_step"] else "-"
                              for part in parts.values()), *(spread if wide else ()))
    wall = tuple(number(v, missing="-") for v in first.get("wall_ms_range", (None, None)))
    table.add_row("wall time", *(f"{part['wall_ms_per_step']:.3f}" for part in parts.values()), *(wall if wide else ()))
    plain = {kind: ms for kind, _, ms, _ in profiler_cost(result)}
    if plain:
        table.add_row("wall time, not profiled", *(number(plain.get(kind), missing="-") for kind in parts),
                      *(("", "") if wide else ()))
        table.caption = ("the profiler's own cost lengthens every profiled step; 'not profiled' is the median of "
                         "the same kind of step run without it (report.md)")
        table.caption_justify = "left"
    for name, ms in result.get("per_refresh_ms", {}).items():  # the optimized SFI's refresh, once per slow step
        table.add_row(f"per refresh: {name}", f"{ms:,.3f}" if name != "candidates" else f"{ms:,}",
                      *(("",) * (len(columns) - 2)))
    return table
