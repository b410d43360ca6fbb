"""One method of one quality run against one method of another, on the prompts both scored.

python benchmarks/paired_across_runs.py RUN_A:METHOD_A RUN_B:METHOD_B [--out FILE]

A quality run pairs its own methods prompt by prompt. A variant run (`--methods sfi --no-nms`, say) holds
only Full-KV and the variant, so comparing it with SnapKV or Quest of the main run needs pairing across
the two runs. That pairing means something only where both runs built the same prompts: the same model,
seed and chat setting, and per record the same prompt length (checked; a mismatch is an error). Records
pair by (task, context, sample index) at equal retention, i.e. equal tokens read per layer and KV head.

Per (task, context, retention) the table gives the paired score difference A - B with its 95% interval and
exact test (metrics/paired.py: McNemar and Newcombe for 0/1 scores, sign test and bootstrap otherwise) and
the paired difference of mean KL to Full-KV (each run's own Full-KV, teacher-forced on its own Full-KV
answer; the two Full-KV answers are the same greedy decode of the same prompt, up to bfloat16 batch noise).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sfibench.core.errors import UsageError  # noqa: E402
from sfibench.metrics.paired import compare, paired_difference_ci  # noqa: E402
from sfibench.reporting.run_files import load_run  # noqa: E402

SAME_PROMPTS = ("model", "seed", "chat")  # config fields that decide which prompts a run builds


def load(spec: str) -> tuple[Path, str, dict]:
    """`RUN:METHOD` -> (run directory, method, results.json)."""
    run, _, method = spec.rpartition(":")
    if not run or not method:
        raise SystemExit(f"error: {spec!r} is not RUN_DIR:METHOD (e.g. reports/quality-x:snapkv)")
    try:
        return Path(run), method, load_run(Path(run), f"run {run}")
    except UsageError as error:  # no such folder, no results.json, a truncated or foreign one
        raise SystemExit(f"error: {error}") from None


def records(data: dict, method: str) -> dict[tuple, dict]:
    """The method's scored records by (task, context, retention, index)."""
    return {(r["task"], r["context"], r["retention"], r["index"]): r for r in data["samples"]
            if r["method"] == method and "score" in r}


def paired_rows(a: dict, b: dict) -> list[dict]:
    """One row per (task, context, retention) both hold: the paired score and KL comparisons."""
    groups: dict[tuple, list[tuple]] = {}
    for key in sorted(a.keys() & b.keys(), key=lambda k: (k[0], k[1], k[2] or 0, k[3])):
        if a[key]["prompt_tokens"] != b[key]["prompt_tokens"]:
            counts = a[key]["prompt_tokens"], b[key]["prompt_tokens"]
            raise SystemExit(f"error: {key[0]} @ {key[1]} prompt {key[3]} has {counts[0]} tokens in one run "
                             f"and {counts[1]} in the other: the runs built different prompts")
        groups.setdefault(key[:3], []).append(key)
    rows = []
    for (task, context, retention), keys in groups.items():
        kl_a, kl_b = [a[k]["kl"] for k in keys], [b[k]["kl"] for k in keys]
        rows.append({"task": task, "context": context, "retention": retention,
                     "score": compare([a[k]["score"] for k in keys], [b[k]["score"] for k in keys]),
                     "kl": paired_difference_ci(kl_b, kl_a, binary=False),
                     "kl_a": sum(kl_a) / len(keys), "kl_b": sum(kl_b) / len(keys)})
    return rows


def _p(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 else f"{value:.1g}"


def markdown(spec_a: str, spec_b: str, data_a: dict, data_b: dict, rows: list[dict]) -> str:
    commits = [str(d.get("provenance", {}).get("git_commit", "?"))[:10] for d in (data_a, data_b)]
    lines = [(f"A = `{spec_a}` (commit {commits[0]}), B = `{spec_b}` (commit {commits[1]}), paired by task, "
              "context, retention and sample index."), "",
             "| task | context | retention | n | A | B | A - B [95%] | b / c | p | KL A | KL B | KL A-B |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        s, k = r["score"], r["kl"]
        retention = "dense" if r["retention"] is None else f"{r['retention']:.4g}"
        lines.append(f"| {r['task']} | {r['context']} | {retention} | {s['n']} | {s['method']:.2f} | "
                     f"{s['reference']:.2f} | {s['difference']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}] | "
                     f"{s['b']} / {s['c']} | {_p(s['p'])} | {r['kl_a']:.3f} | {r['kl_b']:.3f} | "
                     f"{k['mean']:+.3f} [{k['low']:+.3f}, {k['high']:+.3f}] |")  # KL A-B with its interval
    test, interval = rows[0]["score"]["test"], rows[0]["score"]["interval"]
    lines += ["", (f"Scores: {test} test and {interval} interval (b = prompts where A scores above B, c = "
                   "the reverse). KL: mean KL(Full-KV || method) over the answer, paired difference with its "
                   "95% t interval."), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", help="RUN_DIR:METHOD")
    parser.add_argument("b", help="RUN_DIR:METHOD")
    parser.add_argument("--out", type=Path, help="markdown file (default: stdout)")
    args = parser.parse_args(argv)
    (_, method_a, data_a), (_, method_b, data_b) = load(args.a), load(args.b)
    differing = [f for f in SAME_PROMPTS if data_a["config"].get(f) != data_b["config"].get(f)]
    if differing:
        raise SystemExit(f"error: the runs differ in {', '.join(differing)}, so their prompts differ; "
                         "pair runs of the same model, seed and chat setting")
    rows = paired_rows(records(data_a, method_a), records(data_b, method_b))
    if not rows:
        raise SystemExit(f"error: no prompt is scored by both {args.a} and {args.b} at the same retention")
    text = markdown(args.a, args.b, data_a, data_b, rows)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
