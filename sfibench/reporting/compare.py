"""Several runs of one command side by side (two commits, two GPUs, two models): table, plots, deltas.

`compare_runs` reads each run's results.json, flattens them into metrics (run_metrics.py) and saves
the comparison as a results.json of its own (command "report"), so `sfibench report` regenerates it
like any other run. Deltas are against the first run given.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
from rich.table import Table

from sfibench.reporting.baseline import BaselineError
from sfibench.reporting.run_files import load_run

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sfibench.reporting.formatting import commit_label, styled_table
from sfibench.reporting.plot_style import context_axis, context_label, legend_below, save, wrapped, yerr
from sfibench.reporting.results import read_results, write_results, write_text_atomically
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.reporting.run_metrics import device_identity, extract
from sfibench.reporting.speedup_claims import (
    REFERENCE,
    noise_note,
    unsupported_notes,
    verdict_cell,
    verdict_legend,
)
from sfibench.reporting.staging import draw_staged

PANELS_PER_ROW = 4
CAPTION_CHARACTERS_PER_INCH = 13  # of a caption line at 8 points, so it wraps inside the figure


def compare_runs(run_dirs: list[Path], out: Path | None, overwrite: bool) -> Path:
    documents = [load_run(Path(d), f"run {d}") for d in run_dirs]
    commands = sorted({d["command"] for d in documents})
    if len(commands) > 1:
        raise BaselineError(f"these runs come from different commands ({', '.join(commands)}); side by side only "
                            "compares runs of one command")
    runs = [_describe(Path(d), doc) for d, doc in zip(run_dirs, documents)]
    settings = differing_settings(documents)
    rows = side_by_side(documents)
    with claimed_run_dir(out, "report", overwrite=overwrite) as run_dir:
        write_results(run_dir, "report", {"runs": [str(d) for d in run_dirs], "compared_command": commands[0]},
                      {"runs": runs, "rows": rows, "differing_settings": settings})
        draw_staged(run_dir, "report", lambda stage: [render_comparison(stage)])
    return run_dir


def side_by_side(documents: list[dict]) -> list[dict]:
    """One row per metric any run has: its series, context, name and unit, and each run's point."""
    metrics = [{m.key: m for m in extract(doc)} for doc in documents]
    rows = []
    for key in dict.fromkeys(key for run in metrics for key in run):
        present = next(run[key] for run in metrics if key in run)
        rows.append({"key": key, "series": present.series, "context": present.context, "name": present.name,
                     "unit": present.unit, "values": [_point(run.get(key)) for run in metrics]})
    return rows


# provenance that is a setting of the run (what it ran on and with), not a fact about when or where it was
# saved; torch's CPU threads change every CPU timing
PROVENANCE_SETTINGS = ("device", "cpu", "cpu_count", "torch_threads", "gpu_driver", "cuda", "python", "torch",
                       "triton", "transformers", "sfibench")
RUN_LOCAL = ("out", "overwrite", "resume")  # where a run was written, which no comparison is about


def _flat(value, prefix: str = "") -> dict[str, str]:
    """{'sfi.trigger.t_max': '96', ...}: every leaf of a config, spelled as results.json holds it."""
    if isinstance(value, dict):
        return {key: leaf for name, inner in value.items() if name not in RUN_LOCAL
                for key, leaf in _flat(inner, f"{prefix}{name}.").items()}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        # a list of records (SFI's settings per context and retention): one line per record, by its position
        return {f"{prefix}{index}": ", ".join(f"{name} {leaf}" for name, leaf in _flat(item).items())
                for index, item in enumerate(value)}
    if isinstance(value, list) and value and all(isinstance(item, list) for item in value):
        value = ["/".join(map(str, item)) for item in value]  # (method, path) pairs
    text = ",".join(map(str, value)) if isinstance(value, list) else "-" if value is None else str(value)
    return {prefix.rstrip("."): text}


def differing_settings(documents: list[dict]) -> list[dict]:
    """Every setting (config leaf or what the run ran on) whose value is not the same in all runs, with each
    run's value ('-' where a run does not record it): what a reader must know before reading the deltas."""
    flat = [{**_flat(doc.get("config", {})),
             **{f"provenance.{key}": str(doc["provenance"][key]) for key in PROVENANCE_SETTINGS
                if doc.get("provenance", {}).get(key) is not None}} for doc in documents]
    keys = list(dict.fromkeys(key for run in flat for key in run))
    return [{"setting": key, "values": [run.get(key, "-") for run in flat]}
            for key in keys if len({run.get(key, "-") for run in flat}) > 1]


def render_comparison(run_dir: Path) -> Path:
    """comparison plots (one per metric) and report.md from a comparison's results.json."""
    document = read_results(run_dir)
    runs, rows = document["results"]["runs"], document["results"]["rows"]
    plots = [_plot_metric(name, [r for r in rows if r["name"] == name], runs, run_dir)
             for name in dict.fromkeys(r["name"] for r in rows)]
    report = run_dir / "report.md"
    write_text_atomically(report, markdown(document, plots))
    return report


def markdown(document: dict, plots: list[str]) -> str:
    runs, rows = document["results"]["runs"], document["results"]["rows"]
    lines = [f"# sfibench report: {len(runs)} `{document['config']['compared_command']}` runs side by side", "",
             ("Deltas are against run 1. Values in brackets are the 95% interval (quality) or the range over the "
              "timed passes (throughput)."), "", "| run | directory | model | commit | device | date |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {i + 1} | {r['dir']} | {r['model']} | {r['commit']} | {r['device']} | {r['date']} |"
              for i, r in enumerate(runs)]
    noisy = [f"Run {i + 1}: {r['noise']}" for i, r in enumerate(runs) if r.get("noise")]
    lines += ([""] + noisy) if noisy else []
    lines += [""] + settings_lines(document["results"].get("differing_settings"), len(runs))
    lines += ["", "| metric | unit | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |",
              "|---|---|" + "---|" * len(runs)]
    for row in rows:
        cells = [_cell(point, row["values"][0] if i else None) for i, point in enumerate(row["values"])]
        lines.append(f"| {row['key']} | {row['unit']} | " + " | ".join(cells) + " |")
    verdicts = [point["verdict"] for row in rows for point in row["values"] if point.get("verdict")]
    lines += [""] + [f"- {line}" for line in verdict_legend(verdicts)] + ([""] if verdicts else [])
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def terminal_tables(document: dict) -> list[Table]:
    """What `sfibench report A B` prints: the settings the runs differ in (where they do), then every metric
    with each run's value and its change against run 1, as report.md's tables."""
    runs, rows = document["results"]["runs"], document["results"]["rows"]
    names = [f"run {i + 1}" for i in range(len(runs))]
    tables = []
    settings = document["results"].get("differing_settings")
    if settings:
        table = styled_table(f"the runs differ in {len(settings)} setting{'s' if len(settings) > 1 else ''}; a "
                             "delta may come from any of them", ("setting", *names))
        for setting in settings:
            table.add_row(setting["setting"], *setting["values"])
        tables.append(table)
    table = styled_table("metrics side by side (change against run 1)", ("metric", "unit", *names))
    table.columns[0].overflow = "fold"  # a metric's name is what tells rows apart: broken over lines, never cut
    for row in rows:
        table.add_row(row["key"], row["unit"], *(_cell(point, row["values"][0] if i else None)
                                                 for i, point in enumerate(row["values"])))
    return tables + [table]


def settings_lines(settings: list[dict] | None, runs: int) -> list[str]:
    """The settings the runs differ in, as a table, or a sentence saying they share every setting."""
    if settings is None:  # a comparison saved before settings were compared
        return []
    if not settings:
        return ["The runs share every recorded setting (the run's configuration, the device and the package "
                "versions).", ""]
    lines = [f"**The runs differ in {len(settings)} setting{'s' if len(settings) > 1 else ''}**; a delta below "
             "may come from any of them, not only from the code:", "",
             "| setting | " + " | ".join(f"run {i + 1}" for i in range(runs)) + " |", "|---|" + "---|" * runs]
    return lines + [f"| {s['setting']} | " + " | ".join(s["values"]) + " |" for s in settings] + [""]


def _describe(run_dir: Path, document: dict) -> dict:
    prov = document["provenance"]
    described = {"dir": str(run_dir), "model": document["config"].get("model"), "commit": commit_label(prov),
                 "device": device_identity(prov), "date": prov.get("timestamp_utc")}
    if document["command"] == "throughput":  # passes that disagree more than the deltas: said once per run
        described["noise"] = noise_note(document["results"]["rows"])
    return described


def _point(metric) -> dict:
    if metric is None:
        return {"value": None, "low": None, "high": None}
    return {"value": metric.value, "low": metric.low, "high": metric.high,
            **({"verdict": metric.verdict} if metric.verdict else {})}


def _cell(point: dict, first: dict | None) -> str:
    """The value with its interval, and the change against run 1's point where both stand."""
    if point["value"] is None:
        return "-"
    if point.get("verdict"):
        return verdict_cell(point["verdict"])
    text = f"{point['value']:.4g}"
    if point["low"] is not None:
        text += f" [{point['low']:.3g}, {point['high']:.3g}]"
    change = None if first is None else _change(first, point)
    if change is not None:
        base = first["value"]
        text += f" ({change[0]:+.3g}" + (f", {100 * (point['value'] / base - 1):+.1f}%)" if base else ")")
    return text


def _change(first: dict, point: dict) -> tuple[float, float | None, float | None] | None:
    """point - first with an interval combined from both (MOVER: each side's distance to its bound, added in
    quadrature); no interval unless both points have one; None unless both were measured and both stand (a
    ratio a run does not support has no change to show)."""
    if first["value"] is None or point["value"] is None or first.get("verdict") or point.get("verdict"):
        return None
    delta = point["value"] - first["value"]
    if None in (first["low"], first["high"], point["low"], point["high"]):
        return delta, None, None
    below = ((point["value"] - point["low"]) ** 2 + (first["high"] - first["value"]) ** 2) ** 0.5
    above = ((point["high"] - point["value"]) ** 2 + (first["value"] - first["low"]) ** 2) ** 0.5
    return delta, delta - below, delta + above


def _plot_metric(name: str, rows: list[dict], runs: list[dict], run_dir: Path) -> str:
    """Values with their intervals per run, and under each panel the change against run 1 with its interval.

    Series measured at several contexts get a panel each with a context axis (four panels a row);
    otherwise all series sit side by side in one panel. A ratio a run does not support (speedup_claims.py)
    is drawn hollow at 1x, no difference measured, with no change under it, and the caption says why.
    """
    series = list(dict.fromkeys(r["series"] for r in rows))
    by_context = all(r["context"] is not None for r in rows) and len({r["context"] for r in rows}) > 1
    panels = [[r for r in rows if r["series"] == s] for s in series] if by_context else [rows]
    columns = min(PANELS_PER_ROW, len(panels))
    blocks = -(-len(panels) // columns)
    width = 3.8 * columns if by_context else max(5.0, 0.5 * len(rows) * len(runs) + 2)
    fig, axes = plt.subplots(2 * blocks, columns, squeeze=False, layout="constrained", figsize=(width, 4.4 * blocks + 0.8),
                             gridspec_kw={"height_ratios": [2, 1] * blocks})
    unit = rows[0]["unit"]
    for index in range(blocks * columns):
        top, bottom = axes[2 * (index // columns)][index % columns], axes[2 * (index // columns) + 1][index % columns]
        if index >= len(panels):
            top.set_visible(False)
            bottom.set_visible(False)
            continue
        panel_rows = panels[index]
        xs = [r["context"] for r in panel_rows] if by_context else list(range(len(panel_rows)))
        for i, run in enumerate(runs):
            offset = i - (len(runs) - 1) / 2  # runs side by side, so their bars do not hide each other
            shifted = [x * 2 ** (0.04 * offset) if by_context else x + 0.12 * offset for x in xs]
            points = [r["values"][i] for r in panel_rows]
            standing = [_standing(p) for p in points]
            values = [p["value"] for p in standing]
            top.errorbar(shifted, [float("nan") if v is None else v for v in values],
                         yerr=yerr(values, [p["low"] for p in standing], [p["high"] for p in standing]),
                         marker="o", ms=4, capsize=3, ls="none", color=f"C{i}",
                         label=f"run {i + 1}: {run['commit']}, {run['device']}, {run['model']}")
            hollow = [x for x, p in zip(shifted, points) if p.get("verdict") not in (None, REFERENCE)]
            if hollow:
                top.plot(hollow, [1.0] * len(hollow), ls="none", marker="o", mfc="none", ms=7, color=f"C{i}")
            if i:
                changes = [_change(r["values"][0], point) for r, point in zip(panel_rows, points)]
                delta = [float("nan") if c is None else c[0] for c in changes]
                bottom.errorbar(shifted, delta, yerr=yerr(delta, [None if c is None else c[1] for c in changes],
                                                          [None if c is None else c[2] for c in changes]),
                                marker="s", ms=4, capsize=3, ls="none", color=f"C{i}")
        bottom.axhline(0.0, color="grey", lw=0.8)
        # a long unit stays within the panel's height, which is all a vertical label has
        top.set_ylabel(wrapped(f"{name} ({unit})" if unit else name, 36), fontsize=8)
        bottom.set_ylabel(wrapped(f"change vs run 1 ({unit})" if unit else "change vs run 1", 24), fontsize=8)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        if by_context:
            top.set_title(series[index], fontsize=9)
            context_axis(top, xs, label="")
            context_axis(bottom, xs)
        else:
            labels = [_point_name(r) for r in panel_rows]
            top.set_xticks(xs, [])
            top.set_xlim(-0.6, len(xs) - 0.4)
            bottom.set_xlim(-0.6, len(xs) - 0.4)
            bottom.set_xticks(xs, labels, rotation=30, ha="right", fontsize=7)
    notes = unsupported_notes((p.get("verdict"), f"run {i + 1} {_point_name(r)}")
                              for r in rows for i, p in enumerate(r["values"]))
    if notes:
        axes[0][0].plot([], [], ls="none", marker="o", mfc="none", color="grey",
                        label="hollow at 1x: no difference measured")
    width = max(40, int(CAPTION_CHARACTERS_PER_INCH * fig.get_figwidth()))
    legend_below(fig, [axes[0][0]], columns=2, caption="\n".join(wrapped(note, width) for note in notes))
    path = f"compare_{name.replace(' ', '_').replace('/', '_').replace('.', '_')}.png"
    save(fig, run_dir / path)
    return path


def _standing(point: dict) -> dict:
    """A point as drawn: with its interval where the run supports it; a Full-KV reference exactly at its
    1x and no interval; a ratio the run does not support not at all (it is drawn hollow at 1x instead)."""
    if point.get("verdict") == REFERENCE:
        return {**point, "low": None, "high": None}
    return {"value": None, "low": None, "high": None} if point.get("verdict") else point


def _point_name(row: dict) -> str:
    return row["series"] + ("" if row["context"] is None else f" @ {context_label(row['context'])}")
