"""Usage: python benchmarks/memory_table.py [--summary] RUN_DIR [RUN_DIR ...]

The memory estimate beside the measured peak for every row of `sfibench throughput` runs (results.json):
the decode's estimate (weights, cache, snapshot, the row's method state and workspace) against
torch.cuda.max_memory_allocated over that method's decode, and the prefill's peak. A row whose peak is more
than 10% from its estimate is marked: the estimate misses (or over-counts) something the run allocates.
`--summary` prints one line per run instead: its rows, the range of peak over estimate, the rows off by more
than 10%.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 1 << 30
TOLERANCE = 0.10  # a run whose peak differs from its estimate by more is a bug in the estimate


def rows(run_dir: Path):
    document = json.loads((run_dir / "results.json").read_text())
    model = document["config"]["model"]
    for row in document["results"]["rows"]:
        yield model, row


def ratio(row: dict) -> float | None:
    """The decode's peak over its estimate (None where the run recorded either not)."""
    estimate = row.get("memory_estimate", {}).get("decode_total")
    peak = row.get("peak_memory_bytes")
    return peak / estimate if peak and estimate else None


def label(row: dict) -> str:
    return f"{row['method']}{' ' + row['publish'] if row.get('publish') else ''} ctx {row['context']} B={row['batch']}"


def table(run_dirs: list[str]) -> None:
    print("| model | method | path | publish | ctx | B | estimate GiB | peak GiB | peak/est | prefill peak GiB | |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for run_dir in run_dirs:
        for model, row in rows(Path(run_dir)):
            estimate = row.get("memory_estimate", {}).get("decode_total")
            peak, prefill, off = row.get("peak_memory_bytes"), row.get("prefill_peak_memory_bytes"), ratio(row)
            flag = "off by >10%" if off and abs(off - 1) > TOLERANCE else ""
            cells = (model, row["method"], row["path"], row.get("publish", ""), row["context"], row["batch"],
                     f"{estimate / GIB:.1f}" if estimate else "-", f"{peak / GIB:.1f}" if peak else "-",
                     f"{off:.2f}" if off else "-", f"{prefill / GIB:.1f}" if prefill else "-", flag)
            print("| " + " | ".join(str(cell) for cell in cells) + " |")


def summary(run_dirs: list[str]) -> None:
    for run_dir in run_dirs:
        measured = [(ratio(row), row) for _, row in rows(Path(run_dir))]
        ratios = [r for r, _ in measured if r]
        off = [f"{label(row)} {r:.2f}" for r, row in measured if r and abs(r - 1) > TOLERANCE]
        spread = f"peak/estimate {min(ratios):.2f}-{max(ratios):.2f}" if ratios else "no peak recorded"
        print(f"{Path(run_dir).name}: {len(measured)} rows, {spread}; "
              + (f"off by >10%: {', '.join(off)}" if off else "every row within 10%"))


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--summary"]:
        summary(arguments[1:])
    else:
        table(arguments)
