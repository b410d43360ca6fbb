#!/usr/bin/env bash
# Session 5's H200 call: GPU tests of the new kernels, the fast-path benchmark (split counts, Selector
# torch vs Triton), the GPU baseline of `sfibench check`, and an SFI-vs-Full-KV throughput spot check.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cat DEVICE_COMMIT 2>/dev/null
python -m pytest -q -m gpu tests/test_selector_kernels.py tests/test_two_segment.py tests/test_graphs.py -p no:cacheprovider 2>&1 | tail -3
python -m pytest -q tests/test_selector_kernels.py -p no:cacheprovider 2>&1 | tail -2
python -m sfibench.optimized.bench_fast_path --out "$OUT/fast-path.json" 2>&1 | tail -30
bash benchmarks/gpu_baseline.sh > "$OUT/gpu-baseline.log" 2>&1; tail -15 "$OUT/gpu-baseline.log"
tar -cf "$OUT/ci-h200.tar" reports/ci-h200 2>/dev/null
python -m sfibench throughput --model qwen3-4b --ctx 32k,130944 --batch 1 --steps 96 --repeats 2 \
    --methods full_kv/optimized,sfi/optimized,streaming_llm/optimized --no-dense-kernels \
    --out "$OUT/spot" > "$OUT/spot.log" 2>&1; tail -30 "$OUT/spot.log"; tar -cf "$OUT/spot.tar" -C "$OUT" spot
