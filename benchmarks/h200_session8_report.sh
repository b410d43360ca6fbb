#!/usr/bin/env bash
# Session 8's report call: gemv.py's kernels and the decoder that uses them tested on CUDA, the folded
# epilogues timed against separate kernels, then (only if both hold) the 4B (or 0.6B) throughput report
# and profile: `bash benchmarks/h200_session8_report.sh 4b|0.6b [report seconds] [total seconds]`.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
timeout 200 python -m pytest -q -x tests/test_gemv.py tests/test_fused_kernels.py tests/test_graphs.py \
    tests/test_floor.py > "$OUT/tests.log" 2>&1
rc=$?; tail -3 "$OUT/tests.log"
[ "$rc" -eq 0 ] || { echo "CUDA tests failed (rc=$rc): no report"; grep -E "Error|assert" "$OUT/tests.log" | head -20; exit 1; }
timeout 90 python -m sfibench.optimized.bench_gemv --model "qwen3-$1" --batch 1,5 --no-sweep \
    --out "$OUT/gemv-epilogues-$1.json" 2>&1 | grep -v "^\s*$" | tail -4
python - "$OUT/gemv-epilogues-$1.json" <<'PY' || { echo "folded epilogues slower than separate kernels: no report"; exit 1; }
import json, sys
for batch, row in json.load(open(sys.argv[1]))["fused_vs_separate"].items():
    times = [v["ms"] for v in row.values()]
    if times[1] >= times[0]:
        sys.exit(1)
PY
echo "checks done after $((SECONDS - started)) s"
bash benchmarks/h200_report_run.sh "$1" "${2:-420}" "$(( ${3:-560} - (SECONDS - started) ))"
