"""report.md and the terminal summary of `sfibench stability`, written from a results.json document alone."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from sfibench.reporting.formatting import commit_label, number, percent, styled_table
from sfibench.reporting.results import write_text_atomically
from sfibench.reporting.stability_plots import PLOTS, memory_labels

DRIFT_ROWS = (1, 2, 4, 8, 16, 32)  # offsets shown in the drift table, plus the last (open) bin

DEFINITIONS = (
    ("- Attention is dense (Full-KV) at every step. The G query heads of a KV head are pooled by the mean of "
     "their softmax probabilities: the share of the group's attention each position gets."),
    "- Supports are taken over the candidates C = [n_sink, recent_start(L)), the positions SFI selects from.",
    ("- A step opens a sentence when its input token is the first non-ender, non-blank token after an ender "
     "(SPEC 3); the step pair (t-1, t) is then *across* a boundary, otherwise *within*. Steps before the "
     "first boundary count only for consecutive overlap."),
    ("- Overlap = |S_t ∩ S'| / min(|S_t|, |S'|), which is |∩|/k when k is unchanged and keeps a constant "
     "ranking at 1 while k = frac x L grows; Jaccard = |∩|/|∪|."),
    ("- Stale memory: sinks ∪ Selector picks at t0 ∪ [min(recent_start(t0), recent_start(t)), L), what a fast "
     "step after a refresh at t0 reads. Fresh: the same with picks and window from step t. Every other "
     "memory holds the positions another method's step would read, chosen as that method chooses them, "
     "as many per (layer, KV head) as the stale memory reads there at that step; a layer the method "
     "reads densely counts whole, in its recall and in its tokens read. Recall = share of step t's dense attention mass on the memory. t0 is the sentence's first step "
     "(no t_max fallback, no min_gap)."),
)


def summary_sentences(results: dict) -> str:
    """The findings in two sentences with their numbers, whichever way they come out."""
    topk, recall, drift = results["consecutive"]["topk"], results["recall"], results["drift"]["topk_overlap"]
    late = min(len(drift), 16)
    first = (f"Consecutive decode steps share {percent(topk['within']['overlap_mean'])} of their top-k attention "
             f"support within a sentence and {percent(topk['across']['overlap_mean'])} across a sentence boundary, "
             f"and overlap with the sentence's first step falls from {percent(drift[0])} at offset 1 to "
             f"{percent(drift[late - 1])} at offset {late}.")
    others = [f"{percent(recall[name]['mean'])} ({percent(recall[name]['candidate_recall'])}) for {label}"
              for name, label in memory_labels(results).items() if name not in ("stale", "fresh")]
    second = (f"Fast steps reading a selection the SFI Selector made at the sentence's first step keep "
              f"{percent(recall['stale']['mean'])} of the dense attention mass "
              f"({percent(recall['stale']['candidate_recall'])} of the mass on candidates), against "
              f"{percent(recall['fresh']['mean'])} ({percent(recall['fresh']['candidate_recall'])}) for a selection "
              "refreshed at every step" + (", and, reading as many tokens, " + ", ".join(others) if others else "")
              + ".")
    return f"{first} {second}"


def _setup(cfg: dict, results: dict) -> list[str]:
    context, timing, sentences = results["context"], results["timing"], results["sentences"]
    k_head = str(cfg["k_head"])  # "10%" now; runs written before the budget syntax say "0.1"
    k_head += " of L at t0" if k_head.endswith("%") else " x L at t0" if "." in k_head else " tokens"
    rows = {
        "text": f"`{results['text']}`, {results['mode']}",
        "decode steps": (f"{results['steps']} after a {results['prefix_tokens']}-token prefix "
                         f"(context {context['first']} to {context['last']} tokens)"),
        "sentences": f"{sentences['starts']} sentence starts, mean length {number(sentences['mean_length'], 1)} steps",
        "supports": (f"top-k with k = {cfg['topk_frac']:g} x L, and the smallest set holding {cfg['mass']:g} "
                     "of the candidates' attention"),
        "SFI memory": (f"{cfg['sfi']['n_sink']} sinks + Selector picks (k_head = {k_head}) + recent window "
                       f"({cfg['sfi']['n_recent']} tokens, page {cfg['sfi']['page']}, anchored at t0)"),
        "perplexity of the stretch (dense)": number(results["perplexity"], 2),
        "time": (f"load {timing['load_s']:.0f} s, prefill {timing['prefill_s']:.1f} s, decode + analysis "
                 f"{timing['decode_s']:.0f} s ({number(timing['steps_per_s'], 2)} steps/s), "
                 f"{timing['device']} ({timing.get('threads')} threads), {timing['dtype']}"),
    }
    return ["| | |", "| --- | --- |", *(f"| {key} | {value} |" for key, value in rows.items())]


def _consecutive(results: dict) -> list[str]:
    lines = ["| support | side | step pairs | overlap | Jaccard |", "| --- | --- | --- | --- | --- |"]
    for kind, name in (("topk", "top-k"), ("mass", "90% mass")):
        for side in ("within", "across"):
            s = results["consecutive"][kind][side]
            lines.append(f"| {name} | {side} | {s['pairs']} | {number(s['overlap_mean'])} | {number(s['jaccard_mean'])} |")
    lines += ["", (f"For scale: two top-k sets drawn at random from the same candidates would overlap by k/|C| = "
                   f"{number(results['chance_topk_overlap'])} on average.")]
    return lines


def _drift(results: dict) -> list[str]:
    drift, recall, labels = results["drift"], results["recall"], memory_labels(results)
    last = drift["offsets"][-1]
    lines = ["| offset t - t0 | samples | top-k overlap | 90%-mass overlap | "
             + " | ".join(f"recall: {label}" for label in labels.values()) + " |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in labels) + " |"]
    for offset in [o for o in DRIFT_ROWS if o < last] + [last]:
        i = offset - 1
        cells = [drift["topk_overlap"][i], drift["mass_overlap"][i], *(recall[m]["by_offset"][i] for m in labels)]
        label = f">= {offset}" if offset == last else str(offset)
        lines.append(f"| {label} | {drift['samples'][i]} | " + " | ".join(number(c) for c in cells) + " |")
    return lines


def _recall(results: dict) -> list[str]:
    lines = ["| memory | recall of dense mass | recall of candidate mass | mean tokens read |",
             "| --- | --- | --- | --- |"]
    for name, label in memory_labels(results).items():
        r = results["recall"][name]
        lines.append(f"| {label} | {number(r['mean'])} | {number(r['candidate_recall'])} | {number(r['tokens_read_mean'], 0)} |")
    lines += ["", (f"Candidates hold {percent(results['candidate_mass_share'])} of the dense mass on average; the rest "
                   "is on sinks and the recent window, which SFI's memories keep whole.")]
    return lines


def write_report(run_dir: Path | str, document: dict) -> Path:
    """report.md from a results.json document (its config, results and provenance)."""
    cfg, results, prov = document["config"], document["results"], document["provenance"]
    lines = [
        f"# Attention-support stability: {results['model']}", "", summary_sentences(results), "",
        "## Setup", "", *_setup(cfg, results), "",
        "## Consecutive steps: within a sentence vs across a boundary", "", *_consecutive(results), "",
        "## Drift from the sentence's first step, and memory recall by offset", "", *_drift(results), "",
        "## Memory recall over within-sentence steps (t > t0)", "", *_recall(results), "",
        "## Plots", "", *(f"![{title}]({name})\n" for name, title in PLOTS.items()),
        "## Definitions", "", *DEFINITIONS, "",
        (f"Commit `{commit_label(prov)}`, {prov.get('device')}, {prov.get('cpu')}, "
         f"torch {prov.get('torch')}, {prov.get('timestamp_utc')}."), "",
    ]
    path = Path(run_dir) / "report.md"
    write_text_atomically(path, "\n".join(lines))
    return path


def terminal_table(document: dict, wide: bool = False) -> Table:
    """What `sfibench stability` prints when it finishes: consecutive-step overlaps and memory recall; `wide`
    adds the Jaccard indices and the overlap two random top-k sets would have."""
    cfg, results = document["config"], document["results"]
    table = styled_table(f"sfibench stability: {results['model']}, {results['steps']} steps ({results['mode']})",
                         ("measure", "within sentence", "across boundary"), right=("within sentence", "across boundary"))
    for kind, name in (("topk", f"top-{cfg['topk_frac']:g}L"), ("mass", f"{cfg['mass']:g}-mass")):
        for metric in ("overlap", "jaccard") if wide else ("overlap",):
            sides = results["consecutive"][kind]
            table.add_row(f"consecutive {metric}, {name}",
                          *(number(sides[side][f"{metric}_mean"]) for side in ("within", "across")))
    if wide:
        table.add_row(f"chance overlap, top-{cfg['topk_frac']:g}L", number(results["chance_topk_overlap"]), "")
    for memory, label in memory_labels(results).items():
        table.add_row(f"recall: {label}", number(results["recall"][memory]["mean"]), "")
    return table
