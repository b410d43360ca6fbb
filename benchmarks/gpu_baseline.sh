#!/usr/bin/env bash
# Usage: bash benchmarks/gpu_baseline.sh   (from anywhere in the checkout, on the GPU)
# Make reports/ci-h200, the GPU baseline of `sfibench check`, on the GPU it is for (an H200), then prove
# the gate passes against it on the same machine. About 3 minutes: three recorded runs and one check rerun.
# How the runs and tolerances are made: benchmarks/gpu_baseline.py. Commit reports/ci-h200/ afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python benchmarks/gpu_baseline.py
python -m sfibench check --baseline reports/ci-h200
