"""How each method's reasoned answers end: a final "Answer:" line or none, the asked value named or not.

python benchmarks/reasoned_answers.py RUN[:METHOD] ... [--out FILE]

The reasoning tasks (niah_reason, vt_reason: scorer `final_answer`) ask the model to reason and then end on a
line "Answer: <value>"; the score counts that line only. A low score can mean a method lost the value, or that
the model wrote it but not in the requested form, or that it never ended (a repeated sentence until the cap).
Per run, method, task, context and retention the table gives the share of answers that:

- have an "Answer:" line at all (`final_answer_text` is not None),
- score (the value on the final answer's line: the task's own score),
- name the asked value anywhere in the answer (`string_match_all` on the whole text: lenient, not the score),
- reached the answer cap,
- repeat one sentence at least REPEATS times in their second half (a decode that went round in a loop).

Read a difference between two rows as an effect only on the same prompts (paired_across_runs.py pairs them).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from list_recall_by_position import runs_given  # noqa: E402  (this folder: the same RUN[:METHOD] arguments)

from sfibench.metrics.quality import final_answer_text, string_match_all  # noqa: E402

REPEATS = 3  # a sentence written this often in an answer's second half marks a loop
SHORTEST_SENTENCE = 20  # characters: shorter pieces ("1.", "- Key") repeat in any list and mark nothing


def loops(text: str) -> bool:
    """Whether one sentence (a piece between full stops or line breaks) recurs REPEATS times in the second
    half of `text`."""
    pieces = [p.strip() for p in re.split(r"[.\n]", text[len(text) // 2:])]
    counts = Counter(p for p in pieces if len(p) >= SHORTEST_SENTENCE)
    return any(n >= REPEATS for n in counts.values())


def endings(run: str, data: dict, method: str | None) -> dict[tuple, list[dict]]:
    """Per (run, method, task, context, retention): one dict of yes/no findings per reasoned answer."""
    cells: dict[tuple, list[dict]] = {}
    for record in data["samples"]:
        reasoned = record["task"].endswith("_reason")  # the tasks scored by `final_answer`
        if not reasoned or "prediction" not in record or (method and record["method"] != method):
            continue
        text, refs = record["prediction"][0], record["answers"][0]
        key = (run, record["method"], record["task"], record["context"], record["retention"])
        cells.setdefault(key, []).append({
            "answer line": final_answer_text(text) is not None,
            "scored": record["score"] > 0,
            "names value": string_match_all(text, refs) > 0,
            "capped": bool(record.get("answer_capped")),
            "loops": loops(text),
        })
    return cells


COLUMNS = ("answer line", "scored", "names value", "capped", "loops")


def markdown(cells: dict[tuple, list[dict]]) -> str:
    if not cells:
        return "No reasoned answers (niah_reason, vt_reason) in the runs given."
    lines = ["| run | method | task | context | retention | n | " + " | ".join(COLUMNS) + " |",
             "| --- | --- | --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in COLUMNS) + " |"]
    order = sorted(cells, key=lambda k: (k[2], k[3], k[0], k[1], k[4] or 0))
    for run, name, task, context, retention in order:
        answers = cells[(run, name, task, context, retention)]
        shares = " | ".join(f"{sum(a[c] for a in answers) / len(answers):.0%}" for c in COLUMNS)
        shown = "dense" if retention is None else f"{retention:.4g}"
        lines.append(f"| {run} | {name} | {task} | {context} | {shown} | {len(answers)} | {shares} |")
    legend = ("Share of answers with an \"Answer:\" line; scored (the value on the last such line: "
              "the task's score); naming the asked value anywhere (lenient, not the score); "
              f"reaching the answer cap; repeating one sentence of {SHORTEST_SENTENCE}+ characters "
              f"{REPEATS}+ times in their second half.")
    lines += ["", legend]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN[:METHOD]",
                        help="a quality run's folder, optionally :method")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    cells: dict[tuple, list[dict]] = {}
    for name, data, method in runs_given(args.runs):
        cells.update(endings(name, data, method))
    text = markdown(cells)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
