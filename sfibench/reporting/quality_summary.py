"""From per-sample quality records to cells (task x context x method x retention), the claim check, report.md.

The claim under test (SPEC 9): SFI at 15-20% retention matches Full-KV while StreamingLLM and SnapKV
need ~50%. "Matches" is made precise here: the paired 95% interval of (method - Full-KV) on the same
prompts, at least `MIN_MATCH_PAIRS` of them, excludes a drop larger than `MATCH_MARGIN`
(reporting/quality_paired.py). Only tasks Full-KV itself solves (accuracy >= `SOLVED`) support a
conclusion; the others are listed, not interpreted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import partial

from sfibench import registry
from sfibench.metrics.quality import mean_ci
from sfibench.reporting.formatting import commit_label, number
from sfibench.reporting.quality_paired import (
    MATCH_MARGIN,
    MIN_MATCH_PAIRS,
    SOLVED,
    claim_text,
    comparisons,
    paired_section,
)
from sfibench.reporting.quality_refresh import refresh_cell, refresh_section
from sfibench.reporting.quality_sfi_notes import below_full_kv_note, same_answers_note


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(records: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["task"], r["context"], r["method"], r["retention"])].append(r)
    cells = []
    for (task, context, method, retention), rows in groups.items():
        globals_ = [r.get("measured_retention_global") for r in rows]
        cell = {"task": task, "context": context, "method": method, "retention": retention, "n": len(rows),
                "measured_retention": _mean([r["measured_retention"] for r in rows]),
                # None for runs recorded before the global-layer figure existed
                "measured_retention_global": None if None in globals_ else _mean(globals_),
                "kl": _mean([r["kl"] for r in rows]), "top1_agreement": _mean([r["top1_agreement"] for r in rows]),
                "token_agreement": _mean([r["token_agreement"] for r in rows if "token_agreement" in r]),
                "accuracy": None, "perplexity": None, "steps_by_kind": {}}
        for r in rows:
            for kind, count in r["steps_by_kind"].items():
                cell["steps_by_kind"][kind] = cell["steps_by_kind"].get(kind, 0) + count
        scores = [r["score"] for r in rows if "score" in r]
        if scores:
            ci = mean_ci(scores)
            cell.update(accuracy=ci["mean"], ci_low=ci["low"], ci_high=ci["high"], interval=ci["interval"])
            turns = max(len(r["turn_scores"]) for r in rows)
            if turns > 1:
                cell["turn_accuracy"] = [_mean([r["turn_scores"][t] for r in rows]) for t in range(turns)]
            depths = sorted({r["depth"] for r in rows if r.get("depth") is not None})
            cell["accuracy_by_depth"] = {str(d): _mean([r["score"] for r in rows if r.get("depth") == d])
                                         for d in depths}
        nlls = [r["nll"] for r in rows if "nll" in r]
        if nlls:
            cell["perplexity"] = math.exp(sum(nlls) / len(nlls))
        cell.update(refresh_cell(rows))
        cells.append(cell)
    return sorted(cells, key=lambda c: (c["task"], c["context"], c["method"] != registry.dense().name, c["method"],
                                        c["retention"] or 0))


def claim_check(cells: list[dict], records: list[dict] | None,
                paired: list[dict] | None = None) -> tuple[list[dict], list[str]]:
    """Per solved (task, context): the smallest retention at which each method matches Full-KV (paired, on the
    same prompts), or why none does; `records` are the run's per-sample records (None: none recorded), `paired`
    their comparisons where the caller already made them."""
    if paired is None:
        paired = comparisons(records, cells) if records else []
    largest = max((c["retention"] for c in cells if c["retention"] is not None), default=1.0)
    rows, unsolved = [], []
    for full in (c for c in cells if c["method"] == registry.dense().name and c["accuracy"] is not None):
        key = (full["task"], full["context"])
        if full["accuracy"] < SOLVED:
            unsolved.append(f"{key[0]} @ {key[1]} (Full-KV {full['accuracy']:.2f})")
            continue
        row = {"task": key[0], "context": key[1], "dense": full["accuracy"], "verdicts": {}}
        for method in dict.fromkeys(c["method"] for c in cells
                                    if (c["task"], c["context"]) == key and c["method"] != registry.dense().name):
            against_full = [r for r in paired if (r["task"], r["context"], r["method"]) == (*key, method)
                            and r["against"] == registry.dense().name]
            row["verdicts"][method] = (claim_text(against_full, largest) if records
                                       else "undecided (no per-sample records to pair)")
        rows.append(row)
    return rows, unsolved


cell = partial(number, missing="–")  # a quality table marks what a cell did not measure with a dash


def read_scope(config: dict, cells: list[dict]) -> dict:
    """Which measured retention a report prints as "read", and what it is over.

    A budget (retention x context) is what each layer holding a selection may read. Sliding-window
    layers (Gemma-3) hold none: every method, Full-KV included, reads their window as the model
    defines it, so a retention averaged over all layers is not the one the budget sets. Runs record
    the figure over the global layers too; older ones only over all layers (their label says so; a
    Full-KV read below 1 shows the model has sliding layers).
    """
    layers = config.get("attention_layers")
    if layers:
        sliding = layers["layers"] - layers["global"]
    else:
        sliding = any(c["measured_retention"] < 0.999 for c in cells if c["method"] == registry.dense().name)
    if not sliding:
        return {"key": "measured_retention", "sliding": False, "short": "read",
                "label": "tokens read / KV length per decode step, averaged; every layer is global"}
    if all(c.get("measured_retention_global") is not None for c in cells):
        return {"key": "measured_retention_global", "sliding": True, "short": "read, global layers",
                "label": (f"tokens read / KV length per decode step over the {layers['global']} global layers, "
                          f"averaged; the {sliding} sliding-window layers read their {layers['sliding_window']}-token "
                          "window under every method, Full-KV included (the figure over all layers is in the "
                          "fidelity table)")}
    what = (f"{layers['layers']} layers, {sliding} of them sliding-window" if layers else
            "layers, sliding-window layers included")
    return {"key": "measured_retention", "sliding": True, "short": "read, all layers",
            "label": (f"tokens read / KV length per decode step over all {what}, averaged (this run recorded no "
                      "figure over the global layers alone); sliding layers read their window under every "
                      "method, so Full-KV's figure is below 1")}


def _sfi_lines(config: dict, per_layer: str) -> list[str]:
    """What SFI ran with: the preset by name, or the budget rule's result, per context and retention."""
    settings = config.get("sfi_settings")
    presets = config.get("sfi_preset")
    names = dict(zip(config["retentions"], presets.split(","))) if presets else {}
    if not settings:  # runs recorded before the settings were: the preset's name and the rule above
        return [(f"- SFI operating point: preset {presets} (SPEC 4: the authors' k_head, 4 sinks, a 256-token recent "
                 "window, SPEC's triggers)")] if presets else []
    first = settings[0]
    where = " (the authors' operating point, SPEC 4)" if presets else ""
    lines = [(f"- SFI settings{where}: triggers "
              f"{first['trigger']} (t_max {first['t_max']}, min_gap {first['min_gap']}), bridge steps "
              f"{first['bridge_steps']}; per budget, tokens per {per_layer} and KV head:"),
             "", "| context | retention | SFI preset | sinks | k_head | recent window | budget |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {s['context']} | {s['retention']:g} | {names.get(s['retention'], '–')} | {s['n_sink']} | "
              f"{s['k_head']:,} | {s['n_recent']} | {s['budget']:,} |" for s in settings]
    return lines + [""]


def _acc(c: dict) -> str:
    return f"{c['accuracy']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"


def _partial_note(results: dict) -> list[str]:
    """A stopped run's report says so first; runs written before runs could stop record no flag."""
    if results.get("complete", True):
        return []
    progress = results["progress"]
    return [(f"**Partial run**: stopped after {progress['results']} of {progress['planned']} planned sample "
             "results; the tables cover those only (continue it with `--resume`)."), ""]


def markdown(results: dict, plots: list[str]) -> str:
    cfg, cells = results["config"], results["results"]["cells"]
    prov = results["provenance"]
    methods = [m for m in cfg["methods"] if m != registry.dense().name]
    scope = read_scope(cfg, cells)
    per_layer = "global layer" if scope["sliding"] else "layer"
    lines = [f"# sfibench quality — {cfg['model']}", "",
             (f"{prov.get('timestamp_utc')}, device {prov.get('device')} ({prov.get('cpu')}, "
             f"torch threads: {cfg.get('threads')}), dtype {cfg['dtype']}, commit {commit_label(prov)}, "
             f"wall time {results['results']['wall_s'] / 60:.1f} min"
             + "".join(f"; resumed after a session at commit {commit_label(p)} ({p.get('timestamp_utc')})"
                       for p in prov.get("resumed_from", [])) + "."), "",
             *_partial_note(results["results"]),
             "## What ran", "",
             (f"- tasks: {', '.join(cfg['tasks'])}; contexts (prompt tokens, model's own tokenizer): "
             f"{', '.join(map(str, cfg['contexts']))}; samples per cell: {', '.join(map(str, cfg['samples']))}"),
             *([(f"- **SFI ablation**: SFI ran with {', '.join(f'{k}={v}' for k, v in cfg['sfi_variant'].items())} "
                 "instead of SPEC's defaults; every other method as usual")] if cfg.get("sfi_variant") else []),
             (f"- methods: {', '.join([registry.dense().name, *methods])} ({cfg.get('path', 'reference')} path); "
             "retention "
             f"(budget / context: tokens read per {per_layer} and KV head): "
             f"{', '.join(f'{r:g}' for r in cfg['retentions'])}"
             + (f" (SFI preset {cfg['sfi_preset']})" if cfg.get("sfi_preset") else "") + "; greedy decoding; "
             f"{'chat template + answer prefix' if cfg['chat'] else 'plain prompts + answer prefix'} "
             "(ppl: plain prose, no template)"),
             (f"- budget rule: budget = round(retention x context) tokens read per {per_layer} and KV head"
             + (" (sliding-window layers: their window, under every method)" if scope["sliding"] else "")
             + ". SFI: recent "
             "window = budget/4 rounded down to 16-token pages, within [16, 256]; 4 sinks; k_head = the rest. "
             "StreamingLLM: 4 sinks + a window of the rest (keys keep their original RoPE positions). "
             "SnapKV: the budget, its 64-token observation window included. SFI also reads densely on slow "
             "steps and its recent window grows between refreshes, so plots use the *measured* retention."),
             *_sfi_lines(cfg, per_layer),
             f"- read (measured retention): {scope['label']}.",
             (f"- accuracy: mean score with a 95% interval (Wilson for 0/1 scores, bootstrap for partial credit); "
             f"'matches' = the paired 95% interval of (method - Full-KV) on the same prompts, >= {MIN_MATCH_PAIRS} "
             f"of them, excludes a drop larger than {MATCH_MARGIN:g} (Paired comparisons); conclusions only where "
             f"Full-KV >= {SOLVED:g}."),
             ("- fidelity: each method teacher-forced on Full-KV's own greedy continuation; KL(full || method) and "
             "top-1 agreement per decode step (the first answer token comes from the shared prefill and is "
             "excluded); greedy-token agreement = position-wise match of the free-running answers."), "",
             "## Claim check", ""]
    records = results.get("samples")
    paired = comparisons(records, cells) if records else []  # made once: three sections read them
    checks, unsolved = claim_check(cells, records, paired)
    if checks:
        lines += ["| task | context | Full-KV | " + " | ".join(f"{m}: smallest matching retention" for m in methods) + " |",
                  "|---|---|---|" + "---|" * len(methods)]
        for row in checks:
            lines.append(f"| {row['task']} | {row['context']} | {row['dense']:.2f} | "
                         + " | ".join(row["verdicts"].get(m, "–") for m in methods) + " |")
    else:
        lines.append("Full-KV solved no scored task here, so this run supports no conclusion about the methods' "
                     "accuracy" + (" (it scores none: ppl is measured by fidelity and perplexity)."
                                   if all(c["accuracy"] is None for c in cells) else "."))
    if unsolved:
        lines += ["", "Tasks Full-KV does not solve (reported below, not interpreted): " + "; ".join(unsolved) + "."]
    sfi_notes = below_full_kv_note(cfg, cells, records, paired) + same_answers_note(records)
    lines += [""] + sfi_notes if sfi_notes else []
    if any(c["accuracy"] is not None for c in cells):
        lines += ["", "## Accuracy", ""]
    for task in sorted({c["task"] for c in cells if c["accuracy"] is not None}):
        contexts = sorted({c["context"] for c in cells if c["task"] == task})
        lines += [f"### {task}", "", "| method | retention | " + " | ".join(f"{x} tok: acc [95% CI] ({scope['short']})"
                                                                           for x in contexts) + " |",
                  "|---|---|" + "---|" * len(contexts)]
        for method, retention in sorted({(c["method"], c["retention"]) for c in cells if c["task"] == task},
                                        key=lambda k: (k[0] != registry.dense().name, k[0], k[1] or 0)):
            row = []
            for x in contexts:
                c = next((c for c in cells if (c["task"], c["context"], c["method"], c["retention"])
                          == (task, x, method, retention)), None)
                row.append("–" if c is None else f"{_acc(c)} n={c['n']} ({c[scope['key']]:.2f})")
            lines.append(f"| {method} | {'1' if retention is None else f'{retention:g}'} | " + " | ".join(row) + " |")
        turned = [c for c in cells if c["task"] == task and "turn_accuracy" in c]
        if turned:
            lines += ["", ("Accuracy per turn (turn 1 is the question in the prompt; later turns are asked while "
                      "decoding):"), "", "| method | retention | context | " + " | ".join(
                          f"turn {i + 1}" for i in range(len(turned[0]["turn_accuracy"]))) + " |",
                      "|---|---|---|" + "---|" * len(turned[0]["turn_accuracy"])]
            for c in turned:
                lines.append(f"| {c['method']} | {c['retention'] or 1:g} | {c['context']} | "
                             + " | ".join(cell(a, 2) for a in c["turn_accuracy"]) + " |")
        lines.append("")
    if any(c["accuracy"] is not None for c in cells):
        lines += ["", *paired_section(records, cells, paired)]
    both = scope["key"] == "measured_retention_global"  # then the figure over all layers is shown beside it
    compared = [c for c in cells if c["method"] != registry.dense().name]
    if compared:  # a run of the dense method alone has nothing to compare with it
        lines += ["", "## Fidelity to Full-KV (mean over samples)", "",
                  f"| task | method | retention | context | {scope['short']} |" + (" read, all layers |" if both else "")
                  + " KL (nats) | top-1 agree | greedy-token agree | perplexity |",
                  "|---|---|---|---|---|" + ("---|" if both else "") + "---|---|---|---|"]
    for c in compared:
        lines.append(f"| {c['task']} | {c['method']} | {c['retention']:g} | {c['context']} | "
                     f"{c[scope['key']]:.3f} | " + (f"{c['measured_retention']:.3f} | " if both else "")
                     + f"{cell(c['kl'])} | {cell(c['top1_agreement'])} | "
                     f"{cell(c['token_agreement'])} | {cell(c['perplexity'], 2)} |")
    fulls = [c for c in cells if c["method"] == registry.dense().name and c["perplexity"] is not None]
    if fulls:
        lines += ["", "Full-KV perplexity: " + ", ".join(f"{c['context']} tok {c['perplexity']:.2f}" for c in fulls) + "."]
    lines += ["", *refresh_section(results.get("samples") or [])]
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"
