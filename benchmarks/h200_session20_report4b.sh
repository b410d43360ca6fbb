#!/usr/bin/env bash
# Session 20's third call (~6 min): the README's qwen3-4b throughput report at this tree (no profile: the
# profile is of B = 1, which this session's changes do not touch; session 19's stays), then the GPU regression
# gate against reports/ci-h200. `bash benchmarks/h200_session20_report4b.sh` from this tree's export.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
root=$OUT
bash benchmarks/h200_report_run.sh 4b 400 0
echo "report done after $((SECONDS - started)) s"
timeout 150 python -m sfibench check --baseline reports/ci-h200 > "$root/gpu-check.log" 2>&1
echo "check rc=$? after $((SECONDS - started)) s"; tail -4 "$root/gpu-check.log"
