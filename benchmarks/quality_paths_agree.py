"""Do two quality runs of the same prompts agree per prompt, within the noise of bfloat16?

python benchmarks/quality_paths_agree.py NOISE_A NOISE_B RUN_A RUN_B [--out FILE]

Each argument is a `sfibench quality` run directory (results.json) of the same model, tasks, contexts,
seed and budgets. NOISE_A / NOISE_B differ only in dtype (the reference path in float32 and in bfloat16):
what they disagree on is the noise scale of bfloat16 itself. RUN_A / RUN_B are the pair under test (the
reference path and the optimized path, both bfloat16). For every (task, context, method, retention) the
table gives, for each pair, the prompts whose score differs (and in which direction), the greedy answers
that differ, and the mean and largest per-prompt |KL difference|; the last column says whether the pair
under test stays within the noise pair's counts (at most as many differing scores as the noise pair, plus
one). Writes markdown to --out (default: stdout).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def records(run: Path) -> dict[tuple, dict]:
    """Per-prompt records of a quality run, keyed by (task, context, method, retention, index)."""
    data = json.loads((run / "results.json").read_text())
    out = {}
    for record in data["samples"]:
        key = (record["task"], record["context"], record["method"], record["retention"], record["index"])
        out[key] = record
    return out


def config_line(run: Path) -> str:
    data = json.loads((run / "results.json").read_text())
    config, info = data["config"], data.get("provenance", {})
    return (f"`{run.name}`: path {config.get('path')}, dtype {config.get('dtype')}, graphs "
            f"{config.get('graphs', False)}, device {info.get('device')}, "
            f"commit {str(info.get('git_commit', '?'))[:10]}")


def compare(a: dict[tuple, dict], b: dict[tuple, dict]) -> dict[tuple, dict]:
    """Per cell (task, context, method, retention): prompts paired, score differences, answer differences, |dKL|."""
    cells: dict[tuple, dict] = defaultdict(lambda: {"n": 0, "a_better": 0, "b_better": 0, "answers_differ": 0,
                                                     "dkl": []})
    for key in sorted(set(a) & set(b), key=str):
        ra, rb, cell = a[key], b[key], cells[key[:4]]
        cell["n"] += 1
        score_a, score_b = ra.get("score"), rb.get("score")
        if score_a is not None and score_b is not None and abs(score_a - score_b) > 1e-9:
            cell["a_better" if score_a > score_b else "b_better"] += 1
        if ra.get("prediction") != rb.get("prediction"):
            cell["answers_differ"] += 1
        if ra.get("kl") is not None and rb.get("kl") is not None:
            cell["dkl"].append(abs(ra["kl"] - rb["kl"]))
    return cells


def _pair_text(cell: dict) -> str:
    dkl = cell["dkl"]
    kl = f"{sum(dkl) / len(dkl):.3f} / {max(dkl):.3f}" if dkl else "-"
    return f"{cell['a_better']}+{cell['b_better']} | {cell['answers_differ']} | {kl}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs=4, type=Path, help="NOISE_A NOISE_B RUN_A RUN_B")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    noise_a, noise_b, run_a, run_b = args.runs
    noise = compare(records(noise_a), records(noise_b))
    test = compare(records(run_a), records(run_b))
    lines = ["# Per-prompt agreement of two quality runs against the noise of bfloat16", "",
             f"- noise pair: {config_line(noise_a)} against {config_line(noise_b)}",
             f"- pair under test: {config_line(run_a)} against {config_line(run_b)}", "",
             "Per cell: scores that differ (first run better + second run better), greedy answers that differ, "
             "and the mean / largest per-prompt |KL(full || method) difference| in nats. Full-KV's KL is 0 in "
             "every run (it is the reference of its own run), so its row shows answers and scores only.", "",
             "| task | context | method | retention | noise: n | noise: scores | noise: answers | noise: mean/max dKL "
             "| test: n | test: scores | test: answers | test: mean/max dKL | within noise |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    within_all = True
    for key in sorted(set(noise) | set(test), key=str):
        task, context, method, retention = key
        n_cell, t_cell = noise.get(key), test.get(key)
        if n_cell is None or t_cell is None:
            continue
        n_diff = n_cell["a_better"] + n_cell["b_better"]
        t_diff = t_cell["a_better"] + t_cell["b_better"]
        within = t_diff <= n_diff + 1
        within_all &= within
        lines.append(f"| {task} | {context} | {method} | {'-' if retention is None else f'{retention:g}'} | "
                     f"{n_cell['n']} | {_pair_text(n_cell)} | {t_cell['n']} | {_pair_text(t_cell)} | "
                     f"{'yes' if within else 'NO'} |")
    lines += ["", "Every cell within the noise of bfloat16." if within_all else
              "Some cells differ by more than the noise of bfloat16 (rows marked NO)."]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
