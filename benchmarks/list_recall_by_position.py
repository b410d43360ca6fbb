"""Where along a list answer a method goes wrong: the share of values right by their place in the list.

python benchmarks/list_recall_by_position.py RUN[:METHOD] ... [--groups 4] [--shared] [--out FILE]

A list task (niah_list, niah_list_32/64: scorer `ordered_list`) asks for N values in a stated order, one per
sentence, so an answer's later values are written after more of SFI's refreshes than its first ones. The
task's score (ordered recall) says how many values came back, not where the misses fall. Here the i-th
number an answer names counts as right when it is the i-th requested value, and the N places are cut into
`--groups` equal runs (values 1-4, 5-8, ... for N = 16), each with the share right over the prompts scored.

A miss early in the list that shifts the rest (a value skipped or named twice) makes every later place
wrong although the later values may be there; the task's own score forgives that shift, this view does not,
so read it beside the score. Runs and methods are taken as given: pair them (paired_across_runs.py) before
reading a difference between two rows as an effect.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sfibench.core.errors import UsageError  # noqa: E402
from sfibench.metrics.quality import numbers_in  # noqa: E402
from sfibench.reporting.run_files import load_run  # noqa: E402


def places_right(prediction: str, references: list[str]) -> list[bool]:
    """Per requested value, whether the answer's number at that place is that value."""
    named = numbers_in(prediction)
    return [i < len(named) and named[i] == ref.strip() for i, ref in enumerate(references)]


def group_bounds(count: int, groups: int) -> list[tuple[int, int]]:
    """`groups` consecutive runs of places covering 0..count-1 as evenly as the count allows."""
    groups = max(1, min(groups, count))
    edges = [round(g * count / groups) for g in range(groups + 1)]
    return list(zip(edges[:-1], edges[1:]))


def placed_answers(run: str, data: dict, method: str | None) -> dict[tuple, dict[int, list[bool]]]:
    """Per (run, method, task, context, retention, N): each list answer's places right, by sample index."""
    cells: dict[tuple, dict[int, list[bool]]] = {}
    for record in data["samples"]:
        if "prediction" not in record or (method and record["method"] != method):
            continue
        for text, refs in zip(record["prediction"], record["answers"]):
            if len(refs) > 1:  # a list answer; one-value tasks have nothing to place
                key = (run, record["method"], record["task"], record["context"], record["retention"],
                       len(refs))
                cells.setdefault(key, {})[record["index"]] = places_right(text, refs)
    return cells


def keep_shared(cells: dict[tuple, dict[int, list[bool]]]) -> dict[tuple, dict[int, list[bool]]]:
    """Only the prompts that every cell of the same task and context answered (the same prompts where the
    runs were built alike; paired_across_runs.py checks that)."""
    common: dict[tuple, set[int]] = {}
    for key, answers in cells.items():
        task_context = key[2:4]
        common[task_context] = common.get(task_context, set(answers)) & set(answers)
    return {key: {i: a for i, a in answers.items() if i in common[key[2:4]]}
            for key, answers in cells.items()}


def rows(cells: dict[tuple, dict[int, list[bool]]], groups: int) -> list[dict]:
    """One row per cell with answers: prompts and the share right per group of places."""
    out = []
    for (run, name, task, context, retention, count), answers in cells.items():
        if not answers:
            continue
        shares = [sum(sum(a[lo:hi]) for a in answers.values()) / (len(answers) * (hi - lo))
                  for lo, hi in group_bounds(count, groups)]
        out.append({"run": run, "method": name, "task": task, "context": context, "retention": retention,
                    "values": count, "n": len(answers), "shares": shares})
    return sorted(out, key=lambda r: (r["task"], r["context"], r["run"], r["method"], r["retention"] or 0))


def markdown(table: list[dict], groups: int) -> str:
    if not table:
        return "No list answers (a task with more than one requested value) in the runs given."
    bounds = group_bounds(table[0]["values"], groups)
    same = all(r["values"] == table[0]["values"] for r in table)
    heads = ([f"values {lo + 1}-{hi}" for lo, hi in bounds] if same
             else [f"group {g + 1}" for g in range(len(bounds))])
    lines = ["| run | method | task | context | retention | N | n | " + " | ".join(heads) + " |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in heads) + " |"]
    for r in table:
        retention = "dense" if r["retention"] is None else f"{r['retention']:.4g}"
        shares = " | ".join(f"{s:.0%}" for s in r["shares"])
        lines.append(f"| {r['run']} | {r['method']} | {r['task']} | {r['context']} | {retention} | "
                     f"{r['values']} | {r['n']} | {shares} |")
    lines += ["", "Share of answers whose i-th number is the i-th requested value, by runs of places "
              f"(group g: the g-th of {len(bounds)} equal runs of a row's N places); n: answers."]
    return "\n".join(lines)


def runs_given(specs: list[str]) -> list[tuple[str, dict, str | None]]:
    """Each RUN[:METHOD] argument as (the run folder's name, its results, the method or None); a bad one is
    one error line (a folder whose own name holds a colon is taken whole)."""
    given = []
    for spec in specs:
        run, _, method = (spec, "", "") if Path(spec).exists() or ":" not in spec else spec.rpartition(":")
        try:
            given.append((Path(run).name, load_run(Path(run), f"run {run}"), method or None))
        except UsageError as error:  # no such folder, no results.json, a truncated or foreign one
            raise SystemExit(f"error: {error}") from None
    return given


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN[:METHOD]",
                        help="a quality run's folder, optionally :method")
    parser.add_argument("--groups", type=int, default=4,
                        help="runs of places the list is cut into (default 4)")
    parser.add_argument("--shared", action="store_true",
                        help="only the prompts every run and method given answered, per task and context")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    if args.groups < 1:
        parser.error(f"--groups must be at least 1, got {args.groups}")
    cells: dict[tuple, dict[int, list[bool]]] = {}
    for name, data, method in runs_given(args.runs):
        cells.update(placed_answers(name, data, method))
    table = rows(keep_shared(cells) if args.shared else cells, args.groups)
    text = markdown(table, args.groups)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
