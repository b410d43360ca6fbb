#!/usr/bin/env bash
# Session 7's first call: the new kernels' tests on CUDA, then where a refresh's time goes (the Triton
# Selector kernel by kernel, the compact gather torch vs Triton) at 32K and 128K on the Qwen3-4B shape.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cat DEVICE_COMMIT 2>/dev/null
timeout 150 python -m pytest -q -x tests/test_compact_kernels.py tests/test_fused_kernels.py \
    tests/test_selector_kernels.py 2>&1 | tail -4
timeout 240 python -m sfibench.optimized.bench_fast_path --batch "" --contexts 32768,130944 \
    --out "$OUT/refresh-parts.json" 2>&1 | grep -v "^\s*$"
