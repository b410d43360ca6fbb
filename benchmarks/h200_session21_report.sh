#!/usr/bin/env bash
# Session 21's report call (at most DEADLINE s, default 575): the README's qwen3-0.6b throughput report at this tree
# (benchmarks/h200_report_run.sh, without its profile), the GPU regression gate against reports/ci-h200, then the
# qwen3-4b report if the time left covers it; each part with its own time limit.
# `bash benchmarks/h200_session21_report.sh` from an export (with reports/ci-h200) whose DEVICE_COMMIT names it.
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
PYTHONPATH=$PWD bash benchmarks/h200_report_run.sh 0.6b 220 0
echo "0.6b report done after $((SECONDS - started)) s"
PYTHONPATH=$PWD timeout 140 python -m sfibench check --baseline reports/ci-h200 > "$OUT/gpu-check.log" 2>&1
echo "check rc=$? after $((SECONDS - started)) s"; tail -4 "$OUT/gpu-check.log"
left=$((${DEADLINE:-575} - (SECONDS - started)))
if [ "$left" -gt 215 ]; then
    PYTHONPATH=$PWD bash benchmarks/h200_report_run.sh 4b "$left" 0
    echo "4b report done after $((SECONDS - started)) s"
else
    echo "no time left for the 4b report ($left s)"
fi
