"""The tables of a stability report.md, one function per section, each from the results dict alone and
over every segment the run analysed (a section the run has no data for gives no lines)."""

from __future__ import annotations

import math

from sfibench.reporting.formatting import number, percent
from sfibench.reporting.stability_document import REFERENCE, layer_names, memory_labels, segments

DRIFT_ROWS = (1, 2, 4, 8, 16, 32)  # offsets shown in the drift table, plus the last (open) bin
MOVING_NAMES = {"dense_mass": "dense attention mass", "missed_by_stale": "mass the stale SFI memory misses",
                "entering_within": "top-k entrants, within a sentence",
                "entering_across": "top-k entrants, across a boundary"}


def _with_ci(value, half) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return number(value) if half is None or math.isnan(half) else f"{number(value)} ± {number(half)}"


def _mean(values: list) -> float | None:
    """The mean of the measured values (None where a run saved no value), None if there are none."""
    known = [v for v in values if v is not None and not math.isnan(v)]
    return sum(known) / len(known) if known else None


def _row(cells) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _header(*cells) -> list[str]:
    return [_row(cells), _row("---" for _ in cells)]


def segment_rows(results: dict) -> list[str]:
    lines = _header("segment", "steps", "context", "sentences (mean length)", "perplexity (dense)")
    for seg in segments(results):
        context = seg["context"]
        lines.append(_row([seg["label"], seg["steps"], f"{context['first']:,} to {context['last']:,}",
                           f"{seg['sentences']['starts']} ({number(seg['sentences']['mean_length'], 1)})",
                           number(seg["perplexity"], 2)]))
    return lines


def consecutive_rows(results: dict) -> list[str]:
    lines = _header("segment", "support", "side", "step pairs", "overlap (95% CI)", "Jaccard", "chance overlap")
    for seg in segments(results):
        for kind, name in (("topk", "top-k"), ("mass", "90% mass")):
            for side in ("within", "across"):
                s = seg["consecutive"][kind][side]
                chance = number(seg["chance_topk_overlap"]) if kind == "topk" else ""
                lines.append(_row([seg["label"], name, side, s["pairs"], _with_ci(s["overlap_mean"], s.get("overlap_ci95")),
                                   number(s["jaccard_mean"]), chance]))
    return lines


def drift_rows(results: dict) -> list[str]:
    segs = segments(results)
    last = segs[0]["drift"]["offsets"][-1]
    lines = _header("offset t - t0", *(f"{seg['label']}: top-k overlap (sentences)" for seg in segs))
    for offset in [o for o in DRIFT_ROWS if o < last] + [last]:
        i = offset - 1
        cells = [f"{_with_ci(seg['drift']['topk_overlap'][i], (seg['drift'].get('topk_overlap_ci95') or [None] * last)[i])}"
                 f" ({seg['drift']['samples'][i]})" for seg in segs]
        lines.append(_row([f">= {offset}" if offset == last else offset, *cells]))
    return lines


def recall_rows(results: dict) -> list[str]:
    """Every memory's recall of the dense mass (and of the mass on candidates) in each segment."""
    segs = segments(results)
    labels = {}
    for seg in segs:
        labels.update({name: label for name, label in memory_labels(seg).items() if name not in labels})
    lines = _header("memory", *(seg["label"] for seg in segs))
    for name, label in labels.items():
        cells = []
        for seg in segs:
            r = seg["recall"].get(name)
            cells.append("-" if r is None else f"{number(r['mean'])} ({number(r['candidate_recall'])})")
        lines.append(_row([label, *cells]))
    reads = [number(seg["recall"][REFERENCE]["tokens_read_mean"], 0) for seg in segs]
    lines.append(_row(["tokens read per (layer, KV head), every memory", *reads]))
    return lines


def layer_recall_rows(results: dict) -> list[str]:
    """Recall per analysed layer (the mean over KV heads, with the steps' 95% interval of one head)."""
    segs = segments(results)
    names = layer_names(results, segs[0])
    if len(names) > 8:  # a full-depth model: the per-layer heat map carries it
        return []
    lines = _header("segment", "memory", *(f"layer {name}" for name in names))
    for seg in segs:
        for name, label in memory_labels(seg).items():
            r = seg["recall"][name]
            halves = r.get("per_layer_head_ci95") or [[None] * len(row) for row in r["per_layer_head"]]
            cells = [_with_ci(_mean(row), _mean_half(half)) for row, half in zip(r["per_layer_head"], halves)]
            lines.append(_row([seg["label"], label, *cells]))
    return lines


def _mean_half(halves: list) -> float | None:
    """The 95% half-width of a mean over KV heads from each head's, combined as if independent."""
    if any(h is None or math.isnan(h) for h in halves):
        return None
    return math.sqrt(sum(h * h for h in halves)) / len(halves)


def head_rows(results: dict) -> list[str]:
    """Within-sentence consecutive top-k overlap of each query head's own attention, per layer."""
    segs = [seg for seg in segments(results) if seg.get("head_overlap", {}).get("within")]
    if not segs:
        return []
    heads = len(segs[0]["head_overlap"]["within"]["overlap"][0])
    lines = _header("segment", "layer", *(f"head {h}" for h in range(heads)), "across a boundary (mean)")
    for seg in segs:
        within, across = seg["head_overlap"]["within"], seg["head_overlap"].get("across")
        for i, name in enumerate(layer_names(results, seg)):
            cells = [_with_ci(v, c) for v, c in zip(within["overlap"][i], within["overlap_ci95"][i])]
            other = number(_mean(across["overlap"][i])) if across else "n/a"
            lines.append(_row([seg["label"], name, *cells, other]))
    return lines


def moving_rows(results: dict) -> list[str]:
    segs = [seg for seg in segments(results) if seg.get("moving_mass")]
    if not segs:
        return []
    lines = _header("segment", "share of", *segs[0]["moving_mass"]["bins"])
    for seg in segs:
        for key, name in MOVING_NAMES.items():
            series = seg["moving_mass"][key]
            lines.append(_row([seg["label"], name, *(_with_ci(v, c) for v, c in zip(series["mean"], series["ci95"]))]))
    return lines


def needle_rows(results: dict) -> list[str]:
    lines = []
    for seg in (seg for seg in segments(results) if seg.get("needle")):
        needle, labels = seg["needle"], memory_labels(seg)
        verdict = "answered" if needle["answered"] else "not answered"
        lines += [f"**{seg['label']}**: value {needle['value']!r} at depth {needle.get('depth')} (prompt tokens "
                  f"{needle['positions'][0]:,} to {needle['positions'][-1]:,}); the model wrote "
                  f"{needle['answer']!r} ({verdict}).", "",
                  *_header("answer step", "mass on the needle", *labels.values())]
        for entry in needle["steps"]:
            held = [number(_mean(entry["held"][name]), 2) if name in entry["held"] else
                    ("refresh" if entry["slow"] else "-") for name in labels]
            mass = number(_mean(entry["needle_mass"]))
            lines.append(_row([entry["step"], mass, *held]))
        lines.append("")
    return lines


def trigger_rows(results: dict) -> list[str]:
    segs = [seg for seg in segments(results) if seg.get("trigger")]
    if not segs:
        return []
    paired = any("difference" in seg["trigger"] for seg in segs)  # runs saved before it was kept have none
    lines = _header("segment", "fixed interval N", "steps compared", "refreshes: sentence / fixed",
                    "recall: sentence starts", "recall: every N steps", *(("sentence minus fixed",) if paired else ()))
    for seg in segs:
        t = seg["trigger"]
        lines.append(_row([seg["label"], t["interval"], t["steps"],
                           f"{t['sentence']['refreshes']} / {t['fixed']['refreshes']}",
                           _with_ci(t["sentence"]["recall"], t["sentence"]["recall_ci95"]),
                           _with_ci(t["fixed"]["recall"], t["fixed"]["recall_ci95"]),
                           *((_with_ci(t.get("difference"), t.get("difference_ci95")),) if paired else ())]))
    return lines


def readme_block(link: str, document: dict, view: str) -> tuple[str, list[str]]:
    """(conditions, lines) of a segmented run for README.md and docs/: a row per segment with its overlaps,
    its drift and every memory's recall; the full view adds the drift plot."""
    cfg, results = document["config"], document["results"]
    segs = segments(results)
    layers = results.get("layers")
    where = ("every layer" if not layers or len(layers) == results.get("num_layers")
             else f"global layers {', '.join(map(str, layers))}")
    conditions = (f"{results['model']} ({where}), {len(segs)} segments of up to {max(s['steps'] for s in segs):,} "
                  f"steps, top-{cfg['topk_frac']:g}L supports, SFI k_head = {cfg['k_head']}")
    labels = memory_labels(segs[0])
    late = min(len(segs[0]["drift"]["topk_overlap"]), 16)
    lines = [f"![overlap by offset]({link}/overlap_vs_offset.png)", ""] if view == "full" else []
    lines += _header("segment", "overlap within / across", f"vs t0 at 1 / {late}",
                     *(f"recall: {label}" for label in labels.values()),
                     *(("recall: sentence / fixed trigger",) if any(seg.get("trigger") for seg in segs) else ()))
    for seg in segs:
        topk, drift = seg["consecutive"]["topk"], seg["drift"]["topk_overlap"]
        cells = [f"{percent(topk['within']['overlap_mean'])} / {percent(topk['across']['overlap_mean'])}",
                 f"{percent(drift[0])} / {percent(drift[late - 1])}",
                 *(percent(seg["recall"][name]["mean"]) if name in seg["recall"] else "-" for name in labels)]
        if seg.get("trigger"):
            cells.append(f"{percent(seg['trigger']['sentence']['recall'])} / {percent(seg['trigger']['fixed']['recall'])}")
        elif any(s.get("trigger") for s in segs):
            cells.append("-")
        lines.append(_row([seg["label"], *cells]))
    return conditions, lines
