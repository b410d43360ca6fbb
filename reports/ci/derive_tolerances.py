"""Make the CI baseline in this folder: run its commands, measure their spread, derive every tolerance.

    python reports/ci/derive_tolerances.py [--work DIR]

1. Runs each recorded command (RUNS below) into reports/ci/<name>: the baseline itself.
2. Measures how much each metric moves for reasons that are not a regression:
   - seed to seed (quality): the same command at seeds 1 and 2 draws other prompts; the standard
     deviation over seeds 0-2 is the size of a change that a different sample draw alone produces;
   - text to text (stability): the same analysis on two other windows of the shipped essays;
   - run to run (throughput): the whole command twice more; timing is the only thing that moves;
   - numerics (quality, stability): seed 0 again with 1 thread instead of 2, another reduction order,
     which is what another CPU or BLAS build does to the same computation.
3. Writes baseline.json: the recipes, one tolerance rule per metric with the numbers it came from, and
   the first history entry. Rules: accounting (tokens read, slow-step counts and intervals, sentence
   starts) must match exactly; every other metric may move by max(spread, 2 x numeric drift), at
   least one sample's worth for accuracies (1/n: another CPU's rounding can flip one greedy answer).
   Speedups are measured and recorded but not judged here (CPU_SPEED says why); a GPU baseline judges them.

Nothing here is imported by sfibench; `sfibench check --baseline reports/ci` reads what it writes.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sfibench.reporting.baseline import FORMAT, save_manifest
from sfibench.reporting.results import read_results
from sfibench.reporting.run_metrics import INFO, extract

HERE = Path(__file__).resolve().parent
COMMON = ["--model", "smollm2-135m", "--device", "cpu", "--dtype", "float32"]
ENV = {"OMP_NUM_THREADS": "2"}  # fixed, so the reduction order is the same wherever the check runs
SAMPLES = 4
RUNS = {
    "quality": ["quality", *COMMON, "--tasks", "niah_single,ppl", "--ctx", "1k", "--budget", "0.15",
                "--samples", str(SAMPLES), "--batch", "4", "--seed", "0",
                "--methods", "full_kv,sfi,streaming_llm,snapkv"],
    "stability": ["stability", *COMMON, "--steps", "256", "--prefix", "768", "--k-head", "10%"],
    "throughput": ["throughput", *COMMON, "--ctx", "1k,2k", "--steps", "32", "--repeats", "3", "--k-head", "128",
                   "--methods", "full_kv,sfi,streaming_llm,snapkv", "--paths", "reference"],
}
EXACT = [  # deterministic accounting: any change is a change in what the methods read or when they refresh
    ("throughput/*/tokens_read*", "tokens read per layer and KV head on a replayed text: deterministic"),
    ("throughput/*/slow_steps", "slow steps on a replayed text: the trigger rule is deterministic"),
    ("throughput/*/mean_slow_interval", "slow-step interval on a replayed text: deterministic"),
    ("stability/text/recall.stale.tokens_read_mean", "memory size follows from k_head and the geometry alone"),
    ("stability/text/sentences.starts", "sentence starts of a fixed text: deterministic"),
]
TEXT_WINDOWS = (0.3, 0.6)
CPU_SPEED = ("CPU timings on two shared cores: one neighbour can slow every pass of a method (measured run-to-run "
             "ranges up to several hundred percent), so speed is shown, not judged, on this baseline")  # start of the other stability windows, as a share of the essays' characters


def run(argv: list[str], out: Path, env: dict | None = None) -> dict:
    print(f"sfibench {' '.join(argv)} --out {out}", flush=True)
    subprocess.run([sys.executable, "-m", "sfibench", *argv, "--out", str(out), "--overwrite"], check=True,
                   env={**os.environ, **ENV, **(env or {})}, stdout=subprocess.DEVNULL)
    return read_results(out)


def gated(document: dict) -> dict:
    return {m.key: m for m in extract(document) if m.better != INFO}


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    changed = list(argv)
    if option in changed:
        changed[changed.index(option) + 1] = value
    else:
        changed += [option, value]
    return changed


def text_windows(work: Path) -> list[Path]:
    """Two more texts for the stability spread: the shipped essays from later starting points."""
    essays = (Path(__file__).resolve().parents[2] / "sfibench" / "workloads" / "data" / "essays_en.txt").read_text()
    files = []
    for share in TEXT_WINDOWS:
        start = essays.index("\n", int(share * len(essays))) + 1  # start on a line, not mid-word
        files.append(work / f"essays_from_{int(100 * share)}pct.txt")
        files[-1].write_text(essays[start:], encoding="utf-8")
    return files


def derive(baseline: dict, spread_runs: dict, numeric_runs: dict) -> list[dict]:
    """One rule per gated metric: exact for accounting, else max(spread, 2 x numeric drift) with floors."""
    rules = [{"match": pattern, "abs": 0.0, "how": how} for pattern, how in EXACT]
    for name, document in baseline.items():
        metrics = gated(document)
        others = [gated(d) for d in spread_runs[name]]
        numeric = gated(numeric_runs[name]) if name in numeric_runs else {}
        for key, metric in metrics.items():
            if metric.value is None or any(fnmatch.fnmatchcase(key, pattern) for pattern, _ in EXACT):
                continue
            if name == "throughput":
                ratios = [metric.value, *(o[key].value for o in others if key in o)]
                passes = (metric.high - metric.low) / metric.value if metric.low is not None else 0.0
                spread = (max(ratios) - min(ratios)) / statistics.median(ratios)
                rules.append({"match": key, "skip": CPU_SPEED, "how": (
                    f"run to run: speedups {', '.join(f'{r:.3f}' for r in ratios)} over {len(ratios)} runs "
                    f"(range {100 * spread:.1f}% of the median); timed passes of the baseline span "
                    f"{100 * passes:.1f}%")})
                continue
            values = [metric.value, *(o[key].value for o in others if key in o and o[key].value is not None)]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            drift = abs(numeric[key].value - metric.value) if key in numeric and numeric[key].value is not None else 0.0
            tolerance = max(spread, 2 * drift)
            floor = ""
            if metric.name == "accuracy" and tolerance < 1 / SAMPLES:
                tolerance, floor = 1 / SAMPLES, f"; raised to 1/n = {1 / SAMPLES:g} (one answer)"
            source = "seeds 0-2" if name == "quality" else "3 text windows"
            rules.append({"match": key, "abs": tolerance, "how": (
                f"{source}: {', '.join(f'{v:.4g}' for v in values)} (SD {spread:.3g}); 1 thread instead of 2 "
                f"moved it by {drift:.3g}; tolerance = max(SD, 2 x that){floor}")})
    return rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="folder for the spread runs (default: a temp dir)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="sfibench-ci-derive-"))
    work.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    baseline = {name: run(argv, HERE / name) for name, argv in RUNS.items()}
    windows = text_windows(work)
    spread_runs = {
        "quality": [run(with_option(RUNS["quality"], "--seed", str(seed)), work / f"quality-seed{seed}")
                    for seed in (1, 2)],
        "stability": [run([*RUNS["stability"], "--text-file", str(text)], work / f"stability-{text.stem}")
                      for text in windows],
        "throughput": [run(RUNS["throughput"], work / f"throughput-again{i}") for i in (1, 2)],
    }
    numeric_runs = {name: run(RUNS[name], work / f"{name}-1thread", {"OMP_NUM_THREADS": "1"})
                    for name in ("quality", "stability")}
    manifest = {
        "format": FORMAT,
        "about": ("CPU regression baseline for .ci/run: smollm2-135m (real weights), 1K-2K tokens, fixed seeds, "
                  "every method on the reference path. Made by reports/ci/derive_tolerances.py; rules are tried "
                  "in order and the first whose pattern matches a metric key applies."),
        "runs": {name: {"argv": argv, "env": ENV} for name, argv in RUNS.items()},
        "tolerances": derive(baseline, spread_runs, numeric_runs),
        "history": [{"date": started.isoformat(timespec="seconds"), "reason": "first baseline",
                     "commit": baseline["quality"]["provenance"].get("git_commit"), "replaced_commit": None,
                     "runs": sorted(RUNS)}],
    }
    save_manifest(HERE, manifest)
    print(json.dumps({"wrote": str(HERE / "baseline.json"), "rules": len(manifest["tolerances"]),
                      "spread runs in": str(work)}))


if __name__ == "__main__":
    main()
