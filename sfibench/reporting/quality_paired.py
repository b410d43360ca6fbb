"""The paired comparisons of a quality run: each method against Full-KV and against SFI on the same prompts.

Records pair by (task, context, sample index): a method at a retention against Full-KV, and against SFI
at the same retention (the same operating point) where the run has SFI. A record whose prompt the other
condition lacks is left out of that pairing and counted. A task is scored 0/1 when every record of it
is (McNemar and Newcombe), else as partial credit (sign test and bootstrap); metrics/paired.py says how.

Only a (task, context) where Full-KV scores at least `SOLVED` decides anything: there a method that
fails may be failing the model's own task, not the method's selection.
"""

from __future__ import annotations

from sfibench import registry
from sfibench.metrics.paired import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, compare, excluded_drop, is_binary

SOLVED = 0.8  # Full-KV accuracy from which a (task, context) decides anything
MATCH_MARGIN = 0.05  # "matches Full-KV": the paired interval excludes a drop larger than this
MIN_MATCH_PAIRS = 100  # SPEC 9: a claim of no drop needs n >= 100 (a bootstrap over a few tied prompts has no width)
ALPHA = 0.05  # a direction (higher / lower) needs the interval to exclude 0 and the exact test to agree


def _scored(records: list[dict]) -> dict[tuple, dict[int, float]]:
    """Scores by (task, context, method, retention), then by sample index."""
    table: dict[tuple, dict[int, float]] = {}
    for r in records:
        if "score" in r:
            table.setdefault((r["task"], r["context"], r["method"], r["retention"]), {})[r["index"]] = r["score"]
    return table


def comparisons(records: list[dict], cells: list[dict]) -> list[dict]:
    """One row per (task, context, method, retention, reference): the paired comparison, the unpaired count,
    Full-KV's accuracy in that (task, context) and whether it decides anything."""
    dense, sfi = registry.dense().name, registry.BUDGET_REFERENCE
    scored = _scored(records)
    binary = {}
    for (task, *_), by_index in scored.items():
        binary[task] = binary.get(task, True) and is_binary(list(by_index.values()))
    full_kv = {(c["task"], c["context"]): c["accuracy"] for c in cells
               if c["method"] == dense and c.get("accuracy") is not None}
    rows = []
    for (task, context, method, retention), scores in sorted(scored.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2] != sfi, kv[0][2], kv[0][3] or 0)):
        if method == dense or (task, context) not in full_kv:
            continue
        references = [(dense, (task, context, dense, None))]
        if method != sfi and (task, context, sfi, retention) in scored:
            references.append((sfi, (task, context, sfi, retention)))
        for name, key in references:
            other = scored.get(key, {})
            shared = sorted(scores.keys() & other.keys())
            row = {"task": task, "context": context, "method": method, "retention": retention, "against": name,
                   "unpaired": len(scores.keys() ^ other.keys()), "dense_accuracy": full_kv[(task, context)],
                   "decides": full_kv[(task, context)] >= SOLVED, "comparison": None}
            if shared:
                row["comparison"] = compare([scores[i] for i in shared], [other[i] for i in shared],
                                            binary=binary[task])
            rows.append(row)
    return rows


def matches_full_kv(row: dict) -> bool:
    """The claim "matches Full-KV": Full-KV solves the task, at least MIN_MATCH_PAIRS prompts pair, and the
    interval excludes a drop larger than MATCH_MARGIN."""
    comparison = row["comparison"]
    return (row["decides"] and comparison is not None and comparison["n"] >= MIN_MATCH_PAIRS
            and comparison["low"] >= -MATCH_MARGIN)


def lower_by_more_than(comparison: dict, margin: float) -> bool:
    """Decided lower: the interval lies below -margin and the exact test rejects equality at ALPHA."""
    return comparison["high"] < -margin and comparison["p"] < ALPHA


def claim_text(rows: list[dict], largest_retention: float) -> str:
    """A method's entry in the claim check, from its comparisons against Full-KV at every retention of one
    solved (task, context): the smallest retention that matches, or why none does."""
    rows = sorted((r for r in rows if r["comparison"] is not None), key=lambda r: r["retention"])
    if not rows:
        return "undecided (no paired prompts)"
    matching = next((r for r in rows if matches_full_kv(r)), None)
    if matching is not None:
        return f"{matching['retention']:g}"
    # Not matching: either the interval still allows a small drop (n too small) or it excludes one.
    open_rows = [r for r in rows if not lower_by_more_than(r["comparison"], MATCH_MARGIN)]
    if not open_rows:
        return f"none up to {largest_retention:g} (each drops more than {MATCH_MARGIN:g})"
    best = min(open_rows, key=lambda r: -r["comparison"]["low"])
    if best["comparison"]["low"] >= -MATCH_MARGIN:  # within the margin, but on too few prompts
        return f"undecided at {best['retention']:g} (n = {best['comparison']['n']} < {MIN_MATCH_PAIRS} prompts)"
    allowed = -best["comparison"]["low"]
    if allowed >= 0.995:  # a score drops by 1 at most: an interval reaching -1 excludes nothing
        return f"undecided at {best['retention']:g} (n too small: the interval excludes no drop)"
    return f"undecided at {best['retention']:g} (n too small: excludes only drops > {allowed:.2f})"


def _p(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 else f"{value:.1g}"


def _verdict(row: dict) -> str:
    if not row["decides"]:
        return f"decides nothing: Full-KV {row['dense_accuracy']:.2f} < {SOLVED:g}"
    comparison, dense = row["comparison"], registry.dense().name
    drop = excluded_drop(comparison)
    if comparison["low"] > 0:
        return ("higher; " if comparison["p"] < ALPHA else "") + "excludes any drop"
    head = ("lower; " if lower_by_more_than(comparison, 0.0) else
            f"matches Full-KV (margin {MATCH_MARGIN:g}); " if row["against"] == dense and matches_full_kv(row) else "")
    return head + ("excludes any drop" if drop is None else f"excludes a drop larger than {drop:.2f}")


def paired_section(records: list[dict] | None, cells: list[dict], rows: list[dict] | None = None) -> list[str]:
    """The report's "Paired comparisons" section: one table per scored task (`rows`: the records' comparisons,
    where the caller already made them)."""
    lines = ["## Paired comparisons", ""]
    if not records:
        return lines + ["This run's results.json holds no per-sample records, so no comparison is paired.", ""]
    rows = comparisons(records, cells) if rows is None else rows
    if not rows:
        return lines + ["No method was scored beside Full-KV on the same prompts here.", ""]
    lines.append(
        f"Each method against Full-KV and, where the run has SFI, against SFI at the same retention, on the same "
        f"prompts (paired by task, context and sample index). Difference = method - reference with its 95% "
        f"interval; \"excludes a drop larger than X\": X = minus the interval's lower end. Only a task and "
        f"context where Full-KV scores >= {SOLVED:g} decide anything; higher / lower where the interval excludes 0 "
        f"and p < {ALPHA:g}; \"matches Full-KV\" where the interval excludes a drop larger than {MATCH_MARGIN:g} "
        f"on >= {MIN_MATCH_PAIRS} prompts. 0/1 scores: b = prompts the method gets "
        f"right and the reference wrong, c = the reverse, p = exact McNemar (b of b + c at 1/2), interval = "
        f"Newcombe's paired score interval (1998, method 10). Partial credit: b / c = prompts where the method "
        f"scores above / below the reference (ties dropped), p = exact sign test, interval = percentile "
        f"bootstrap over prompts ({BOOTSTRAP_RESAMPLES:,} resamples, seed {BOOTSTRAP_SEED}).")
    unpaired = [r for r in rows if r["unpaired"]]
    lines += ["", ("Every record has its partner in the compared condition." if not unpaired else
                   "Records without a partner in the compared condition, left out of the pairing: "
                   + "; ".join(f"{r['task']} @ {r['context']} {r['method']} {r['retention']:g} vs {r['against']}: "
                               f"{r['unpaired']}" for r in unpaired) + "."), ""]
    for task in sorted({r["task"] for r in rows}):
        here = [r for r in rows if r["task"] == task]
        scale = next((r["comparison"]["test"] for r in here if r["comparison"]), "McNemar")
        counts = "b / c" if scale == "McNemar" else "b / c (sign)"
        lines += [f"### {task} ({'0/1 scores' if scale == 'McNemar' else 'partial credit'})", "",
                  (f"| context | method | retention | against | pairs | method / reference | {counts} | "
                   f"{scale} p | difference [95% CI] | verdict |"), "|---|---|---|---|---|---|---|---|---|---|"]
        for r in here:
            c = r["comparison"]
            head = f"| {r['context']} | {r['method']} | {r['retention']:g} | {r['against']} |"
            if c is None:
                lines.append(head + " 0 | – | – | – | – | no paired prompts |")
                continue
            lines.append(head + f" {c['n']} | {c['method']:.2f} / {c['reference']:.2f} | {c['b']} / {c['c']} | "
                         f"{_p(c['p'])} | {c['difference']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] | {_verdict(r)} |")
        lines.append("")
    return lines
