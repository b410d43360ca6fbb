"""One table across a model family's committed throughput runs, for the `family` results block (docs/performance.md).

A row per (model, context, batch), in the order the block names the runs; a column per method on the
optimized path (a run without optimized rows shows its reference rows). Each cell is the row's tok/s, its
speedup over Full-KV where the run supports one, and its graphed step against its floor (the weights floor
measured in the run + the step's K/V bytes at copy bandwidth); the last column is the decode's measured
peak memory over its estimate, lowest and highest of the row's methods. Where two runs hold the same
(model, context, batch, method), the first named wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from sfibench.reporting.formatting import commit_label
from sfibench.reporting.plot_style import context_label
from sfibench.reporting.readme_tables import row_against_floor, tokens_per_s
from sfibench.reporting.run_metrics import device_identity
from sfibench.reporting.throughput_report import method_label


def family_block(runs: list[tuple[Path, str, dict]]) -> list[str]:
    """The lines of the block for `runs`: (folder, link to it, its results.json document) each."""
    for folder, _, document in runs:
        if document["command"] != "throughput":
            raise ValueError(f"{folder} holds a `{document['command']}` run; the family view shows throughput runs")
    cells, shapes = {}, []  # (model, context, batch, method label) -> row; shapes in order of first sight
    for folder, link, document in runs:
        model, rows = document["config"]["model"], document["results"]["rows"]
        if any(r["path"] == "optimized" for r in rows):
            rows = [r for r in rows if r["path"] == "optimized"]
        for row in sorted(rows, key=lambda r: (r["context"], r["batch"])):
            shape = (model, row["context"], row["batch"])
            if shape not in shapes:
                shapes.append(shape)
            cells.setdefault((*shape, method_label(row)), (row, link))
    labels = list(dict.fromkeys(key[3] for key in cells))
    lines = [_conditions(runs), "", "| model | context | B | " + " | ".join(labels) + " | peak / estimate |",
             "| --- | ---: | ---: |" + " --- |" * len(labels) + " --- |"]
    for model, context, batch in shapes:
        found = [cells.get((model, context, batch, label)) for label in labels]
        link = next(link for cell in found if cell for link in [cell[1]])
        lines.append(f"| [{model}]({link}/report.md) | {context_label(context)} | {batch} | "
                     + " | ".join(_cell(cell[0]) if cell else "-" for cell in found)
                     + f" | {_memory([cell[0] for cell in found if cell])} |")
    return [*lines, ""]


def _conditions(runs: list[tuple[Path, str, dict]]) -> str:
    models = [document["config"]["model"] for _, _, document in runs]
    family = os.path.commonprefix(models).rstrip("-_") or "model"
    facts = sorted({f"{device_identity(d['provenance'])}, {d['results']['dtype']}, {d['results']['weights']}"
                    for _, _, d in runs})
    sources = "; ".join(f"[{folder.name}]({link}/report.md): commit {commit_label(d['provenance'])}, "
                        f"{str(d['provenance'].get('timestamp_utc'))[:10]}, {d['config']['steps']} decode steps x "
                        f"{d['config']['repeats']} timed passes" for folder, link, d in runs)
    return (f"**The {family} family**: {'; '.join(facts)}. Each cell: tok/s, median of the passes (speedup over "
            "Full-KV where the run supports one), and the graphed step's p50 over its floor (the weights floor "
            "measured in the run + the step's K/V bytes at copy bandwidth; SFI's fast step, the other methods' "
            "only step); peak / estimate: the decode's measured peak memory over its estimate, lowest and "
            f"highest of the row's methods. Runs: {sources}.")


def _cell(row: dict) -> str:
    floor = row_against_floor(row)
    return tokens_per_s(row) + (f", {floor[1]:.2f}x floor" if floor else "")


def _memory(rows: list[dict]) -> str:
    ratios = [r["peak_memory_bytes"] / r["memory_estimate"]["decode_total"] for r in rows
              if r.get("peak_memory_bytes") and (r.get("memory_estimate") or {}).get("decode_total")]
    if not ratios:
        return "-"
    return f"{min(ratios):.2f}" if f"{min(ratios):.2f}" == f"{max(ratios):.2f}" else \
        f"{min(ratios):.2f}-{max(ratios):.2f}"
