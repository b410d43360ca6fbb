#!/usr/bin/env bash
# Session 18's last call (~7 min): the 0.6B throughput report at the tree with the fused step prologue
# (benchmarks/h200_report_run.sh 0.6b, no profile: too little device time left), then, in 60 s, the GPU
# regression gate against reports/ci-h200 (qwen3-0.6b, B = 1; the export must include reports/ci-h200).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
root=$OUT
mkdir -p "$root/report"
OUT=$root/report bash benchmarks/h200_report_run.sh 0.6b 330 330
started=$SECONDS
timeout 60 python -m sfibench check --baseline reports/ci-h200 > "$root/gpu-check.log" 2>&1
echo "check rc=$? after $((SECONDS - started)) s"; tail -4 "$root/gpu-check.log"
