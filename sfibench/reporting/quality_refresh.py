"""Whether a method's refresh fired, and how it kept to Full-KV along long answers: report.md's sections.

Slow steps per answer, their spacing and the answer length, per cell; and, for answers long enough to
keep per-step fidelity, KL and top-1 agreement early and late in the answer.

SFI refreshes its selection on slow steps (SPEC 3), which fire at the first token of a new generated
sentence. An answer of a few tokens has none, so its score judges only the selection made at the prompt;
the report says so in words for every (task, method) where no answer had one. Records written before
these fields existed carry none; their cells show a dash and the report says they were not recorded.
"""

from __future__ import annotations

from collections import defaultdict

QUARTERS = ("first", "last")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def refresh_cell(rows: list[dict]) -> dict:
    """The refresh figures of one cell's records: slow steps per answer, the mean interval between consecutive
    slow steps (pooled over the answers: every gap counts once), the mean answer length and the share of
    answers that ran into the cap. Records from before these fields give their slow steps from
    `steps_by_kind` and None for the rest."""
    if not rows:
        return {}
    slow = [r.get("slow_steps", r.get("steps_by_kind", {}).get("slow", 0)) for r in rows]
    cell = {"slow_steps_per_answer": sum(slow) / len(rows), "answers_with_slow_steps": sum(s > 0 for s in slow),
            "slow_interval": None, "answer_tokens": None, "capped_share": None}
    if all("slow_interval" in r for r in rows):
        timed = [r for r in rows if r["slow_interval"] is not None]
        gaps = sum(r["slow_steps"] - 1 for r in timed)
        cell["slow_interval"] = sum(r["slow_interval"] * (r["slow_steps"] - 1) for r in timed) / gaps if gaps else None
    if all("answer_tokens" in r for r in rows):
        cell["answer_tokens"] = _mean([r["answer_tokens"] for r in rows])
    if all("answer_capped" in r for r in rows):
        cell["capped_share"] = _mean([float(r["answer_capped"]) for r in rows])
    exact = [r["exact_match"] for r in rows if "exact_match" in r]
    if exact:
        cell["exact_match"] = sum(exact) / len(exact)
    return cell


REFRESHING_KINDS = {"slow", "bridge", "fast"}  # the step kinds of a method with slow steps (engine/decode.step_kinds)


def _slow_methods(cells: list[dict]) -> list[dict]:
    """Cells of methods that have slow steps (Full-KV reads densely and the baselines never refresh)."""
    return [c for c in cells if c["kinds"] & REFRESHING_KINDS]


def refresh_cells(samples: list[dict]) -> list[dict]:
    """One cell of refresh figures per (task, context, method, retention), from a run's per-sample records."""
    groups: dict[tuple, list[dict]] = {}
    for r in samples:
        groups.setdefault((r["task"], r["context"], r["method"], r["retention"]), []).append(r)
    cells = []
    for (task, context, method, retention), rows in groups.items():
        kinds: set[str] = set().union(*(r.get("steps_by_kind", {}) for r in rows))
        cells.append({"task": task, "context": context, "method": method, "retention": retention, "n": len(rows),
                      "kinds": kinds, **refresh_cell(rows)})
    return sorted(cells, key=lambda c: (c["task"], c["context"], c["retention"] is not None, c["method"],
                                        c["retention"] or 0))


def refresh_section(samples: list[dict]) -> list[str]:
    """report.md's section on slow steps, from the per-sample records: a sentence per (task, method) whose
    refresh never fired, one per (task, method) whose refresh did, and a table per cell; then the section on
    fidelity along long answers where records kept it."""
    recorded = refresh_cells(samples)
    if not recorded:
        return []
    lines = ["## Refresh: slow steps per answer", ""]
    sparse = _slow_methods(recorded)
    never = sorted({(c["task"], c["method"]) for c in sparse}
                   - {(c["task"], c["method"]) for c in sparse if c["answers_with_slow_steps"] > 0})
    fired = sorted({(c["task"], c["method"]) for c in sparse if c["answers_with_slow_steps"] > 0})
    for task, method in never:
        lines.append(f"- {method}'s refresh never fired on {task}: 0 slow steps in every answer, so its score "
                     "there judges only the selection made at the prompt.")
    for task, method in fired:
        per = [c for c in sparse if (c["task"], c["method"]) == (task, method)]
        lines.append(f"- {method} refreshed on {task}: "
                     + "; ".join(f"{c['slow_steps_per_answer']:.2f} slow steps per answer at retention "
                                 f"{c['retention']:g}, {c['context']} tokens" for c in per) + ".")
    if not sparse:
        lines.append("No method in this run has slow steps.")
    lines += ["", ("Slow steps per answer (mean; a multi-turn sample counts the steps of the questions forced "
                   "between its answers too), the mean interval between consecutive slow steps (decode steps; – "
                   "with fewer than two in every answer), the mean answer length (tokens) and the share of answers "
                   "that reached the answer cap:")]
    if any(c["answer_tokens"] is None for c in recorded):
        lines.append("Rows with a dash for the length: their records predate these figures, so their slow steps "
                     "come from the step kinds and their interval, length and cap were not recorded.")
    lines += ["", ("| task | context | method | retention | slow steps / answer | answers with one | mean interval | "
                   "answer tokens | capped |"), "|---|---|---|---|---|---|---|---|---|"]
    for c in recorded:
        retention = "1" if c["retention"] is None else f"{c['retention']:g}"
        interval = "–" if c["slow_interval"] is None else f"{c['slow_interval']:.1f}"
        length = "–" if c["answer_tokens"] is None else f"{c['answer_tokens']:.1f}"
        capped = "–" if c["capped_share"] is None else f"{c['capped_share']:.2f}"
        lines.append(f"| {c['task']} | {c['context']} | {c['method']} | {retention} | "
                     f"{c['slow_steps_per_answer']:.2f} | {c['answers_with_slow_steps']}/{c['n']} | {interval} | "
                     f"{length} | {capped} |")
    exact = [c for c in recorded if "exact_match" in c]
    if exact:
        lines += ["", "Exact match of the whole list (every value, in the requested order): "
                  + "; ".join(f"{c['task']} @ {c['context']} {c['method']}"
                              f"{'' if c['retention'] is None else '@' + format(c['retention'], 'g')} "
                              f"{c['exact_match']:.2f}" for c in exact) + "."]
    return [*lines, "", *long_fidelity_section(samples)]


def _quarter(values: list[float], which: str) -> float:
    """Mean of the first or last quarter of `values` (at least one value)."""
    size = max(1, len(values) // 4)
    part = values[:size] if which == "first" else values[-size:]
    return sum(part) / len(part)


def _cell_mean(records: list[dict], field: str, which: str) -> float:
    return sum(_quarter(r[field], which) for r in records) / len(records)


def long_fidelity_section(samples: list[dict]) -> list[str]:
    """report.md's table of fidelity along long answers: does a method drift from Full-KV as the answer goes on?
    Per cell, KL and top-1 agreement over the first and the last quarter of the steps, and the slow steps."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in samples:
        if record.get("kl_steps"):
            groups[(record["task"], record["context"], record["retention"], record["method"])].append(record)
    if not groups:
        return []
    lines = ["## Fidelity along long answers", "",
             ("Each method teacher-forced on Full-KV's own answer (answers of 256 steps or more keep every step; "
              "long_fidelity.png draws them): KL(full || method) in nats and top-1 agreement, averaged over the first "
              "and the last quarter of each answer's steps, then over the answers; slow steps in the taught run."),
             "", ("| task | context | retention | method | answers | steps | KL first | KL last | top-1 first | "
                  "top-1 last | slow steps |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (task, context, retention, method), records in sorted(groups.items()):
        steps = sum(len(r["kl_steps"]) for r in records) / len(records)
        slow = sum(len(r.get("taught_slow_steps", [])) for r in records) / len(records)
        lines.append(f"| {task} | {context} | {retention:g} | {method} | {len(records)} | {steps:.0f} | "
                     + " | ".join(f"{_cell_mean(records, 'kl_steps', q):.3f}" for q in QUARTERS) + " | "
                     + " | ".join(f"{_cell_mean(records, 'top1_steps', q):.2f}" for q in QUARTERS) + f" | {slow:.1f} |")
    return lines + [""]
