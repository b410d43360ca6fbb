"""One table across several committed quality runs, for the `grid` results block of README.md and docs/.

A row per (task, context, budget group): a budget group is a run's list of retentions, named by its SFI
preset where the run has one. A column per method in registry order; an SFI run with an ablation
(config "sfi_variant") fills a column of its own after SFI, named by the command-line flags that run it.
Each cell is the accuracy at each retention of the row's group (Full-KV: its one accuracy); `n` is the
prompts per cell, lowest-highest where the row's cells differ, so a partial run shows. Where two runs hold
the same cell, the first named wins. A row whose Full-KV scores below `SOLVED` is marked: there a method
that fails may be failing the model's own task (reporting/quality_paired.py).
"""

from __future__ import annotations

from pathlib import Path

from sfibench import registry
from sfibench.reporting.formatting import commit_label, number
from sfibench.reporting.plot_style import context_label
from sfibench.reporting.quality_paired import SOLVED
from sfibench.reporting.run_metrics import device_identity

UNSOLVED = "‡"  # marks Full-KV's cell in a row that decides nothing


def grid_block(runs: list[tuple[Path, str, dict]]) -> list[str]:
    """The lines of the block for `runs`: (folder, link to it, its results.json document) each."""
    for folder, _, document in runs:
        if document["command"] != "quality":
            raise ValueError(f"{folder} holds a `{document['command']}` run; the grid view shows quality runs "
                             "(name throughput runs in a `family` block)")
    dense = registry.dense().name
    cells, rows, columns, groups = {}, [], [], {}  # (row, column, retention) -> cell; rows, columns first seen
    for _, _, document in runs:
        cfg = document["config"]
        retentions = tuple(cfg["retentions"])
        groups.setdefault(retentions, _group(cfg))
        # a run's sfi_variant changes the budget reference's (SFI's) settings only: its column alone moves
        own = _column(registry.BUDGET_REFERENCE, cfg.get("sfi_variant"))
        for method in dict.fromkeys([dense, *cfg["methods"]]):
            column = (method, own if method == registry.BUDGET_REFERENCE else method)
            if column not in columns:
                columns.append(column)
        task_order = {task: i for i, task in enumerate(cfg["tasks"])}  # the run's own order, not the cells'
        for cell in sorted(document["results"]["cells"], key=lambda c: task_order.get(c["task"], len(task_order))):
            row = (_setup(cfg), cell["task"], cell["context"], retentions)
            if row not in rows:
                rows.append(row)
            label = own if cell["method"] == registry.BUDGET_REFERENCE else cell["method"]
            cells.setdefault((row, label, cell["retention"]), cell)
    # registry order, a variant after its plain method; sorted() is stable, so variants keep the runs' order
    columns = [label for _, label in sorted(columns, key=lambda c: (_method_order(c[0]), c[1] != c[0]))]
    tasks, setups = list(dict.fromkeys(row[1] for row in rows)), list(dict.fromkeys(row[0] for row in rows))
    order = list(groups)
    rows.sort(key=lambda r: (tasks.index(r[1]), setups.index(r[0]), r[2], order.index(r[3])))
    lead = ["model"] if len(setups) > 1 else []  # one model and path: the conditions line names them
    lines = [_conditions(runs, groups), "",
             "| " + " | ".join([*lead, "task", "context", "budget", "n", *columns]) + " |",
             "| " + " | ".join(["---"] * (len(lead) + 1) + ["---:", "---", "---:"] + ["---"] * len(columns)) + " |"]
    marked = False
    for row in rows:
        setup, task, context, retentions = row
        found = {label: [cells.get((row, label, r)) for r in ((None,) if label == dense else retentions)]
                 for label in columns}
        texts = [_cell(found[label], label == dense) for label in columns]
        full = found[dense][0]
        if full and full["accuracy"] is not None and full["accuracy"] < SOLVED:
            texts[columns.index(dense)] += f" {UNSOLVED}"
            marked = True
        counts = sorted({cell["n"] for here in found.values() for cell in here if cell})
        n = "-" if not counts else str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        lines.append("| " + " | ".join([*([setup] if lead else []), task, context_label(context),
                                        groups[retentions][0], n, *texts]) + " |")
    if marked:
        lines += ["", f"{UNSOLVED} Full-KV below {SOLVED:g}: the row decides nothing"]
    return [*lines, ""]


FLAG_OF_FIELD = {"policy": "trigger"}  # the trigger's policy field is set by --trigger


def variant_flags(variant: dict | None) -> str:
    """The command-line flags that run SFI as `variant` (a field it changes -> its value): a switched-off
    Selector part `use_x` is `--no-x`, any other field `--field value`, except the trigger's `policy`, which
    `--trigger` sets (commands/sfi_options.py spells them so, and tests hold the two together)."""
    flags = []
    for field, value in (variant or {}).items():
        if isinstance(value, bool) and field.startswith("use_"):
            flags.append(f"--{'' if value else 'no-'}{field.removeprefix('use_').replace('_', '-')}")
        else:
            flag = FLAG_OF_FIELD.get(field, field).replace("_", "-")
            flags.append(f"--{flag} {value:g}" if isinstance(value, float) else f"--{flag} {value}")
    return " ".join(flags)


def _column(method: str, variant: dict | None) -> str:
    return f"{method} {variant_flags(variant)}" if variant else method


def _method_order(method: str) -> int:
    names = registry.names()
    return names.index(method) if method in names else len(names)


def _setup(cfg: dict) -> str:
    """What rows of different runs must share to be compared in one row: the model and the path."""
    return f"{cfg['model']} ({cfg.get('path', 'reference')})"


def _group(cfg: dict) -> tuple[str, str | None]:
    """A budget group's label and, for an SFI preset, the tokens each method reads per layer and KV head
    (a preset run has one context, so retention x context gives them back)."""
    if cfg.get("sfi_preset"):  # the authors' operating points, named
        tokens = " / ".join(f"{round(r * cfg['contexts'][0]):,}" for r in cfg["retentions"])
        return cfg["sfi_preset"].replace(",", " / "), tokens
    return " / ".join(f"{r:g}" for r in cfg["retentions"]), None


def _cell(found: list[dict | None], dense: bool) -> str:
    if dense:
        cell = found[0]
        if cell is None:
            return "-"
        return number(cell["accuracy"], 2) if cell["accuracy"] is not None else f"ppl {number(cell['perplexity'], 2)}"
    if not any(found):  # the method did not run at this row's budget
        return "-"
    return " / ".join("-" if cell is None else number(cell["accuracy"], 2) if cell["accuracy"] is not None
                      else number(cell.get("kl"), 3) for cell in found)


def _conditions(runs: list[tuple[Path, str, dict]], groups: dict[tuple, tuple[str, str | None]]) -> str:
    models = list(dict.fromkeys(d["config"]["model"] for _, _, d in runs))
    paths = list(dict.fromkeys(d["config"].get("path", "reference") for _, _, d in runs))
    devices = list(dict.fromkeys(device_identity(d["provenance"]) for _, _, d in runs))
    presets = "; ".join(dict.fromkeys(f"{label} = {tokens} tokens" for label, tokens in groups.values() if tokens))
    ppl = any("ppl" in d["config"].get("tasks", []) for _, _, d in runs)
    layers = sorted({f"{a['global']} of {a['layers']}" for _, _, d in runs
                     for a in [d["config"].get("attention_layers")] if a and a["global"] < a["layers"]})
    sources = "; ".join(f"[{folder.name}]({link}/report.md): commit {commit_label(d['provenance'])}, "
                        f"{str(d['provenance'].get('timestamp_utc'))[:10]}"
                        + ("" if d["results"].get("complete", True) else ", stopped early (partial)")
                        for folder, link, d in runs)
    return (f"**{', '.join(models)}**, {' and '.join(paths)} path, on {' and '.join(devices)}. Each cell: accuracy "
            "at each retention of the row's budget, Full-KV's one accuracy"
            + ("; ppl: KL to Full-KV in nats, Full-KV its perplexity" if ppl else "")
            + "; n: prompts per cell"
            + (f"; SFI presets read, per layer and KV head, {presets}" if presets else "")
            + (f"; a budget counts the global attention layers ({', '.join(layers)})" if layers else "")
            + f". Runs: {sources}.")
