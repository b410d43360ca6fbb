"""Usage: python benchmarks/memory_table.py RUN_DIR [RUN_DIR ...]

The memory estimate beside the measured peak for every row of `sfibench throughput` runs (results.json):
the decode's estimate (weights, cache, snapshot, the row's method state and workspace) against
torch.cuda.max_memory_allocated over that method's decode, and the prefill's peak. A row whose peak is more
than 10% from its estimate is marked: the estimate misses (or over-counts) something the run allocates."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 1 << 30


def rows(run_dir: Path):
    document = json.loads((run_dir / "results.json").read_text())
    model = document["config"]["model"]
    for row in document["results"]["rows"]:
        yield model, row


def main(run_dirs: list[str]) -> None:
    print("| model | method | path | publish | ctx | B | estimate GiB | peak GiB | peak/est | prefill peak GiB | |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for run_dir in run_dirs:
        for model, row in rows(Path(run_dir)):
            estimate = row.get("memory_estimate", {}).get("decode_total")
            peak, prefill = row.get("peak_memory_bytes"), row.get("prefill_peak_memory_bytes")
            ratio = peak / estimate if peak and estimate else None
            flag = "off by >10%" if ratio and abs(ratio - 1) > 0.10 else ""
            cells = (model, row["method"], row["path"], row.get("publish", ""), row["context"], row["batch"],
                     f"{estimate / GIB:.1f}" if estimate else "-", f"{peak / GIB:.1f}" if peak else "-",
                     f"{ratio:.2f}" if ratio else "-", f"{prefill / GIB:.1f}" if prefill else "-", flag)
            print("| " + " | ".join(str(cell) for cell in cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
