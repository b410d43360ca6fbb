#!/usr/bin/env bash
# Session 8's first call: the kernels' tests on CUDA (the GEMV with its prologues, the fused layer ops incl.
# the RoPE position table, the compact gather), then cuBLAS against the Triton GEMV at the Qwen3-4B shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cat DEVICE_COMMIT 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python -m pytest -q -x tests/test_gemv.py tests/test_fused_kernels.py tests/test_compact_kernels.py \
    2>&1 | tail -6
timeout 330 python -m sfibench.optimized.bench_gemv --model qwen3-4b --batch 1,5 --out "$OUT/gemv-sweep.json" 2>&1 \
    | grep -v "^\s*$" | tail -30
