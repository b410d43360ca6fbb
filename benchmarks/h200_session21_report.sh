#!/usr/bin/env bash
# Session 21's report call (~7 min): the README's two throughput reports at this tree (benchmarks/
# h200_report_run.sh, qwen3-0.6b then qwen3-4b, without their profiles), each with its own time limit.
# `bash benchmarks/h200_session21_report.sh` from an export whose DEVICE_COMMIT names the tree.
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
PYTHONPATH=$PWD bash benchmarks/h200_report_run.sh 0.6b 250 0
echo "0.6b report done after $((SECONDS - started)) s"
PYTHONPATH=$PWD bash benchmarks/h200_report_run.sh 4b 300 0
echo "4b report done after $((SECONDS - started)) s"
