"""report.md and the terminal summary of `sfibench stability`, written from a results.json document alone."""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from sfibench.reporting import stability_tables as tables
from sfibench.reporting.formatting import commit_label, number, percent, styled_table
from sfibench.reporting.results import write_text_atomically
from sfibench.reporting.stability_document import REFERENCE, memory_labels, segments
from sfibench.reporting.stability_plots import PLOTS

DEFINITIONS = (
    ("- Attention is dense (Full-KV) at every step. The G query heads of a KV head are pooled by the mean of "
     "their softmax probabilities: the share of the group's attention each position gets. A model with "
     "sliding-window layers is analysed on its global layers, the only ones any method selects on."),
    "- Supports are taken over the candidates C = [n_sink, recent_start(L)), the positions SFI selects from.",
    ("- A step opens a sentence when its input token is the first non-ender, non-blank token after an ender "
     "(SPEC 3); the step pair (t-1, t) is then *across* a boundary, otherwise *within*. Steps before the "
     "first boundary count only for consecutive overlap."),
    ("- Overlap = |S_t ∩ S'| / min(|S_t|, |S'|), which is |∩|/k when k is unchanged and keeps a constant "
     "ranking at 1 while k = frac x L grows; Jaccard = |∩|/|∪|. Per query head: the same top-k overlap of "
     "each head's own attention."),
    ("- Stale memory: sinks ∪ Selector picks at t0 ∪ [min(recent_start(t0), recent_start(t)), L), what a fast "
     "step after a refresh at t0 reads (before the first refresh, the bootstrap selection prefill makes from "
     "the last w_prefill prompt queries). Fresh: the same with picks and window from step t. Every other "
     "memory holds the positions another method's step would read, chosen as that method chooses them, "
     "as many per (layer, KV head) as the stale memory reads there at that step; a layer the method "
     "reads densely counts whole, in its recall and in its tokens read. Recall = share of step t's dense "
     "attention mass on the memory, over within-sentence steps; t0 is the sentence's first step (no t_max "
     "fallback, no min_gap)."),
    ("- Distance of a position j at step t: L - 1 - j tokens behind the current one (the sinks, always read, "
     "count apart); the recent window is the first 256-271. Entrants: positions in S_t and not in S_{t-1}."),
    ("- Triggers: SFI's memory refreshed at sentence starts, and refreshed every N steps with N the sentence "
     "trigger's mean interval (over the forced tokens; for generated text, over the prompt's sentences), over "
     "every step both have a selection for; a refresh step reads densely and counts 1."),
)


def _spread(values: list[float | None]) -> str:
    """'53.9%' for one value, '41.2-60.3%' for several (n/a where none was measured)."""
    known = sorted(v for v in values if v is not None and not math.isnan(v))
    if not known:
        return "n/a"
    low, high = percent(known[0]), percent(known[-1])
    return low if low == high else f"{low.removesuffix('%')}-{high}"


def summary_sentences(results: dict) -> str:
    """The findings with their numbers, whichever way they come out (ranges over segments)."""
    segs = segments(results)
    late = min(len(segs[0]["drift"]["topk_overlap"]), 16)
    topk = [seg["consecutive"]["topk"] for seg in segs]
    over = f" over {len(segs)} segments" if len(segs) > 1 else ""
    first = (f"Consecutive decode steps share {_spread([t['within']['overlap_mean'] for t in topk])} of their top-k "
             f"attention support within a sentence and {_spread([t['across']['overlap_mean'] for t in topk])} across "
             f"a sentence boundary{over}, and overlap with the sentence's first step falls from "
             f"{_spread([seg['drift']['topk_overlap'][0] for seg in segs])} at offset 1 to "
             f"{_spread([seg['drift']['topk_overlap'][late - 1] for seg in segs])} at offset {late}.")
    labels = memory_labels(segs[0])

    def recall(name: str) -> str:
        return _spread([seg["recall"][name]["mean"] for seg in segs if name in seg["recall"]])

    others = [f"{recall(name)} for {label}" for name, label in labels.items() if name not in (REFERENCE, "fresh")]
    second = (f"Fast steps reading a selection the SFI Selector made at the sentence's first step keep "
              f"{recall(REFERENCE)} of the dense attention mass, against {recall('fresh')} for a selection "
              "refreshed at every step" + (", and, reading as many tokens, " + ", ".join(others) if others else "")
              + ".")
    triggers = [seg["trigger"] for seg in segs if seg.get("trigger")]
    if not triggers:
        return f"{first} {second}"
    counts = ", ".join(f"{t['sentence']['refreshes']} / {t['fixed']['refreshes']}" for t in triggers)
    third = (f"Refreshing at sentence starts gives {_spread([t['sentence']['recall'] for t in triggers])} recall "
             f"over every step against {_spread([t['fixed']['recall'] for t in triggers])} for refreshing every N "
             f"steps at the sentence trigger's rate (refreshes, sentence / fixed: {counts}).")
    return f"{first} {second} {third}"


def _setup(document: dict) -> list[str]:
    cfg, results = document["config"], document["results"]
    segs = segments(results)
    timing = results.get("timing") or segs[0]["timing"]
    k_head = str(cfg["k_head"])  # "10%" now; runs written before the budget syntax say "0.1"
    k_head += " of L at t0" if k_head.endswith("%") else " x L at t0" if "." in k_head else " tokens"
    layers = results.get("layers")
    rows = {
        "text": f"`{results['text']}`",
        "layers analysed": ("every layer" if layers is None or len(layers) == results.get("num_layers") else
                            f"the global layers {', '.join(map(str, layers))} of {results['num_layers']}"),
        "segments": ", ".join(seg["label"] for seg in segs),
        "supports": (f"top-k with k = {cfg['topk_frac']:g} x L, and the smallest set holding {cfg['mass']:g} "
                     "of the candidates' attention"),
        "SFI memory": (f"{cfg['sfi']['n_sink']} sinks + Selector picks (k_head = {k_head}) + recent window "
                       f"({cfg['sfi']['n_recent']} tokens, page {cfg['sfi']['page']}, anchored at t0)"),
        "time": (f"load {timing['load_s']:.0f} s; " + "; ".join(
            f"{seg['label']}: prefill {seg.get('timing', timing)['prefill_s']:.1f} s, decode + analysis "
            f"{seg.get('timing', timing)['decode_s']:.0f} s" for seg in segs)
                 + f"; {timing['device']} ({timing.get('threads')} threads), {timing['dtype']}"),
    }
    if any(seg["mode"] == "generated" for seg in segs):
        answers = "a task's answer greedy, then " if any(seg.get("needle") for seg in segs) else ""
        rows["sampling"] = f"{answers}temperature {cfg['temperature']:g}, top-p {cfg['top_p']:g}, seed {cfg['seed']}"
    return ["| | |", "| --- | --- |", *(f"| {key} | {value} |" for key, value in rows.items())]


SECTIONS = (  # (heading, table, text under it)
    ("Segments", tables.segment_rows, ""),
    ("Consecutive steps: within a sentence vs across a boundary", tables.consecutive_rows,
     "For scale: two top-k sets drawn at random from the same candidates overlap by k/|C| (chance overlap)."),
    ("Drift from the sentence's first step", tables.drift_rows,
     "Mean top-k overlap with the support at t0 and its 95% interval over sentences (sentences reaching the offset)."),
    ("Memory recall over within-sentence steps (t > t0)", tables.recall_rows,
     "Recall of the dense mass (of the mass on candidates); every memory reads as many tokens per (layer, KV head) "
     "as SFI's stale memory."),
    ("Recall per layer", tables.layer_recall_rows, "Mean over KV heads, 95% interval over steps."),
    ("Which heads move: each query head's own top-k, consecutive steps within a sentence", tables.head_rows,
     "95% interval over step pairs."),
    ("Where attention and what moves sit, by distance behind the current token", tables.moving_rows,
     "Shares per step, 95% interval over steps."),
    ("The needle at the answer steps", tables.needle_rows,
     "Share of the needle's value tokens each memory holds, the mean over analysed layers and KV heads; refresh: "
     "SFI refreshes at that step, reading every token, and no memory is compared there."),
    ("Refreshing at sentence starts vs every N steps", tables.trigger_rows,
     "Recall of SFI's memory over every step both triggers have a selection for; a refresh step reads densely "
     "and counts 1. 95% intervals over steps, the difference's paired by step; consecutive steps are not "
     "independent, so an interval that only just excludes 0 is weak evidence."),
)


def write_report(run_dir: Path | str, document: dict) -> Path:
    """report.md from a results.json document (its config, results and provenance)."""
    results, prov = document["results"], document["provenance"]
    lines = [f"# Attention-support stability: {results['model']}", "", summary_sentences(results), "",
             "## Setup", "", *_setup(document), ""]
    for heading, table, note in SECTIONS:
        rows = table(results)
        if rows:
            lines += [f"## {heading}", "", *rows, "", *([note, ""] if note else [])]
    drawn = [name for name in PLOTS if (Path(run_dir) / name).exists()]
    lines += ["## Plots", "", *(f"![{PLOTS[name]}]({name})\n" for name in drawn),
              "## Definitions", "", *DEFINITIONS, "",
              (f"Commit `{commit_label(prov)}`, {prov.get('device')}, {prov.get('cpu')}, "
               f"torch {prov.get('torch')}, {prov.get('timestamp_utc')}."), ""]
    path = Path(run_dir) / "report.md"
    write_text_atomically(path, "\n".join(lines))
    return path


def terminal_table(document: dict, wide: bool = False) -> Table:
    """What `sfibench stability` prints when it finishes. One segment: consecutive-step overlaps and memory
    recall (`wide` adds the Jaccard indices and the overlap two random top-k sets would have); several: one
    row per segment with its overlaps and SFI's recall (`wide` adds the fresh selection's)."""
    cfg, results = document["config"], document["results"]
    segs = segments(results)
    if len(segs) > 1:
        columns = ("segment", "within", "across", "SFI recall", *(("fresh",) if wide else ()))
        table = styled_table(f"sfibench stability: {results['model']}, top-{cfg['topk_frac']:g}L overlap",
                             columns, right=columns[1:])
        for seg in segs:
            topk = seg["consecutive"]["topk"]
            table.add_row(seg["label"], number(topk["within"]["overlap_mean"]), number(topk["across"]["overlap_mean"]),
                          number(seg["recall"][REFERENCE]["mean"]),
                          *((number(seg["recall"]["fresh"]["mean"]),) if wide else ()))
        return table
    seg = segs[0]
    table = styled_table(f"sfibench stability: {results['model']}, {seg['steps']} steps ({seg['mode']})",
                         ("measure", "within sentence", "across boundary"), right=("within sentence", "across boundary"))
    for kind, name in (("topk", f"top-{cfg['topk_frac']:g}L"), ("mass", f"{cfg['mass']:g}-mass")):
        for metric in ("overlap", "jaccard") if wide else ("overlap",):
            sides = seg["consecutive"][kind]
            table.add_row(f"consecutive {metric}, {name}",
                          *(number(sides[side][f"{metric}_mean"]) for side in ("within", "across")))
    if wide:
        table.add_row(f"chance overlap, top-{cfg['topk_frac']:g}L", number(seg["chance_topk_overlap"]), "")
    for memory, label in memory_labels(seg).items():
        table.add_row(f"recall: {label}", number(seg["recall"][memory]["mean"]), "")
    return table
