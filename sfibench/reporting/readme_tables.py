"""Markdown for the results blocks of README.md and docs/: one committed run each, its conditions, a link,
its main plot and its table.

Only the run's results.json is read, so the pages say exactly what the committed reports hold; the
prose around the blocks interprets the numbers and is written by hand. A block may name a view first:
`full` (the default: plot and whole table), `compact` (no plot; a throughput run shows its optimized
rows only) or `floors` (a throughput run's graphed steps against their floors).
"""

from __future__ import annotations

from pathlib import Path

from sfibench import registry
from sfibench.reporting.formatting import commit_label, number, percent
from sfibench.reporting.plot_style import context_label
from sfibench.reporting.run_metrics import device_identity
from sfibench.reporting.stability_tables import readme_block
from sfibench.reporting.throughput_report import dense_kernel_verdicts, method_label

VIEWS = ("full", "compact", "floors")


def run_block(folder: Path, link: str, document: dict, view: str = "full") -> list[str]:
    """The lines for one run: a heading line with its conditions, then the command's table in `view`."""
    command = document["command"]
    if command not in TABLES:
        raise ValueError(f"{folder} holds a `{command}` run; a results block shows {', '.join(TABLES)} runs")
    if view == "floors" and command != "throughput":
        raise ValueError(f"{folder} holds a `{command}` run; the `floors` view is for throughput runs")
    conditions, table = TABLES[command](link, document, view)
    if view != "full":  # the plot is one click away, in report.md
        table = [line for line in table if not line.startswith("![")]
        table = table[1:] if table and table[0] == "" else table
    prov = document["provenance"]
    where = (f"{device_identity(prov)}, commit {commit_label(prov)}, "
             f"{str(prov.get('timestamp_utc'))[:10]}")
    return [f"**[{folder.name}]({link}/report.md)**: {conditions}; {where}.", "", *table, ""]


def _throughput(link: str, document: dict, view: str) -> tuple[str, list[str]]:
    from sfibench.reporting import throughput_requests_report as requests

    if requests.is_request_run(document):
        return requests.readme_table(link, document)
    cfg, results = document["config"], document["results"]
    rows = results["rows"]
    if view != "full" and any(r["path"] == "optimized" for r in rows):
        rows = [r for r in rows if r["path"] == "optimized"]
    shapes = sorted({(r["batch"], r["context"]) for r in rows})
    series = list(dict.fromkeys((method_label(r), r["path"]) for r in rows))
    conditions = (f"{cfg['model']} ({results['weights']}), {results['dtype']}, {cfg['steps']} decode steps x "
                  f"{cfg['repeats']} timed passes, copy bandwidth {results['copy_bandwidth_gb_s']:,.0f} GB/s; ")
    cell = tokens_per_s
    if view == "floors":
        conditions += ("graphed step p50 in ms (x its floor: the weights floor measured in the run + the "
                       "step's K/V bytes at copy bandwidth); SFI's fast step, the other methods' only step")
        cell = _against_floor
    else:
        conditions += "tok/s, median of the passes (speedup over the fastest Full-KV where the run supports one)"
    lines = [f"![throughput]({link}/throughput.png)", "",
             "| method | path | " + " | ".join(f"{context_label(c)} B={b}" for b, c in shapes) + " |",
             "| --- | --- |" + " --- |" * len(shapes)]
    for label, path in series:
        cells = []
        for batch, context in shapes:
            row = next((r for r in rows if (method_label(r), r["path"], r["batch"], r["context"])
                        == (label, path, batch, context)), None)
            cells.append("-" if row is None else cell(row))
        lines.append(f"| {label} | {path} | " + " | ".join(cells) + " |")
    if view == "floors":
        return conditions, lines
    roofline = {}  # bytes bound of SFI's first row at each shape: it depends on that row's measured slow rate
    for r in rows:
        if r.get("roofline_speedup"):
            roofline.setdefault((r["batch"], r["context"]), r["roofline_speedup"])
    if roofline:
        lines.append("| sfi roofline speedup (bytes) | | "
                     + " | ".join(f"{roofline[s]:.2f}x" if s in roofline else "-" for s in shapes) + " |")
    verdicts = dense_kernel_verdicts(results.get("dense_kernels") or [])
    if verdicts and view == "full":
        lines += ["", "Full-KV's kernel against the fastest SDPA backend, one layer's K/V bytes over time (GB/s): "
                  + "; ".join(f"{context_label(c)} B={b} {ours['gb_s']:,.0f} vs {best['gb_s']:,.0f} "
                              f"({best['kernel']})" for b, c, ours, best in verdicts) + "."]
    return conditions, lines


def tokens_per_s(row: dict) -> str:
    """A row's tok/s, with its speedup over Full-KV where the run supports one."""
    text = f"{row['tokens_per_s']:,.1f}"
    if row["method"] != registry.dense().name and row.get("speedup_vs_full_kv") and row.get("speedup_supported"):
        text += f" ({row['speedup_vs_full_kv']:.2f}x)"
    return text


def row_against_floor(row: dict) -> tuple[float, float] | None:
    """(p50 ms, p50 over its floor) of the step a row mostly takes (SFI's fast step, the others' only one),
    or None where the run recorded no floor."""
    steps = row.get("ms_per_step") or {}
    kind = next((k for k in ("fast", "sparse", "dense") if k in steps), None)
    step, floor = steps.get(kind), (row.get("floor_ms") or {}).get(kind)
    if not step or not floor:
        return None
    return step["p50"], step["p50"] / floor


def _against_floor(row: dict) -> str:
    against = row_against_floor(row)
    return "-" if against is None else f"{against[0]:.3f} ({against[1]:.2f}x)"


def _quality(link: str, document: dict, view: str) -> tuple[str, list[str]]:
    cfg, cells = document["config"], document["results"]["cells"]
    methods = list(dict.fromkeys([registry.dense().name, *cfg["methods"]]))
    retentions = " / ".join(f"{r:g}" for r in cfg["retentions"])
    if cfg.get("sfi_preset"):  # the budget of the authors' operating point, named
        retentions += f" (SFI preset {cfg['sfi_preset'].replace(',', ' / ')})"
    layers = cfg.get("attention_layers")  # a budget applies to the layers holding a selection
    if layers and layers["global"] < layers["layers"]:
        retentions = f"(budget / context on the {layers['global']} global layers of {layers['layers']}) {retentions}"
    variant = cfg.get("sfi_variant")
    measure = ("accuracy (ppl: KL to Full-KV in nats, Full-KV: perplexity)" if "ppl" in cfg["tasks"] else "accuracy")
    conditions = (f"{cfg['model']}, {', '.join(cfg['tasks'])}, samples {'/'.join(map(str, cfg['samples']))} per "
                  f"context, {cfg.get('path', 'reference')} path"
                  + (f", SFI with {', '.join(f'{k}={v}' for k, v in variant.items())}" if variant else "")
                  + ("" if document["results"].get("complete", True) else ", **stopped early (partial)**")
                  + f"; {measure} at retention {retentions}")
    plot = ("accuracy_vs_retention.png" if set(cfg["tasks"]) - {"ppl"} else "fidelity_vs_retention.png")
    lines = [f"![{plot.removesuffix('.png').replace('_', ' ')}]({link}/{plot})", "",
             "| task | context | " + " | ".join(methods) + " |", "| --- | --- |" + " --- |" * len(methods)]
    for task in cfg["tasks"]:
        for context in cfg["contexts"]:
            here = [c for c in cells if (c["task"], c["context"]) == (task, context)]
            if here:
                lines.append(f"| {task} | {context_label(context)} | "
                             + " | ".join(_quality_cell(here, m, cfg["retentions"]) for m in methods) + " |")
    return conditions, lines


def _quality_cell(cells: list[dict], method: str, retentions: list[float]) -> str:
    if method == registry.dense().name:
        dense = next((c for c in cells if c["method"] == method), None)
        if dense is None:
            return "-"
        return number(dense["accuracy"], 2) if dense["accuracy"] is not None else f"ppl {number(dense['perplexity'], 2)}"
    values = []
    for retention in retentions:
        cell = next((c for c in cells if c["method"] == method and c["retention"] == retention), None)
        if cell is None:
            values.append("-")
        else:
            values.append(number(cell["accuracy"], 2) if cell["accuracy"] is not None else number(cell["kl"], 3))
    return " / ".join(values)


def _stability(link: str, document: dict, view: str) -> tuple[str, list[str]]:
    cfg, results = document["config"], document["results"]
    if "segments" in results:
        return readme_block(link, document, view)
    topk, mass, recall = results["consecutive"]["topk"], results["consecutive"]["mass"], results["recall"]
    drift = results["drift"]["topk_overlap"]
    late = min(len(drift), 16)
    conditions = (f"{results['model']}, {results['steps']:,} {results['mode']} steps, context "
                  f"{results['context']['first']:,} to {results['context']['last']:,} tokens, "
                  f"{results['sentences']['starts']} sentence starts, top-{cfg['topk_frac']:g}L and "
                  f"{cfg['mass']:g}-mass supports")
    lines = [f"![overlap by offset]({link}/overlap_vs_offset.png)", "",
             "| measure | within a sentence | across a boundary |", "| --- | --- | --- |",
             f"| consecutive-step overlap, top-k | {percent(topk['within']['overlap_mean'])} | "
             f"{percent(topk['across']['overlap_mean'])} |",
             f"| consecutive-step overlap, mass | {percent(mass['within']['overlap_mean'])} | "
             f"{percent(mass['across']['overlap_mean'])} |",
             f"| overlap with the sentence's first step, offset 1 / {late} | {percent(drift[0])} / "
             f"{percent(drift[late - 1])} | |",
             *(f"| recall: {name} | {percent(recall[memory]['mean'])} | |"
               for memory, name in (("stale", "SFI selection from the sentence start"),
                                    ("fresh", "SFI selection at every step"),
                                    ("streaming", "StreamingLLM, as many tokens")))]
    return conditions, lines


def _profile(link: str, document: dict, view: str) -> tuple[str, list[str]]:
    cfg, results = document["config"], document["results"]
    parts, ranges = results["ms_per_step"], results.get("ms_per_step_range") or {}
    conditions = (f"{cfg['model']}, {cfg['method']} on the {cfg['path']} path, {context_label(cfg['context'])} "
                  f"tokens, B={cfg['batch']}, {cfg['steps']} steps; {results['clock']}")
    lines = [f"![profile]({link}/profile.png)", "", "| part of a step | ms per step | fastest / slowest step |",
             "| --- | --- | --- |"]
    ranges = {**ranges, "wall time": results.get("wall_ms_range")}
    for part, ms in [*parts.items(), ("wall time", results["wall_ms_per_step"])]:
        spread = f"{ranges[part][0]:.3f} / {ranges[part][1]:.3f}" if ranges.get(part) else "-"
        lines.append(f"| {part} | {ms:.3f} | {spread} |")
    refresh = results.get("per_refresh_ms") or {}
    for part, ms in refresh.items():
        if part != "candidates":
            lines.append(f"| per refresh: {part} (timed alone, eager) | {ms:.3f} | |")
    if "slow" in (results.get("step_ms_by_kind") or {}):
        lines.append(f"| a whole slow step (median) | {results['step_ms_by_kind']['slow']:.3f} | |")
    return conditions, lines


TABLES = {"throughput": _throughput, "quality": _quality, "stability": _stability, "profile": _profile}
