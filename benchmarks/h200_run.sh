#!/usr/bin/env bash
# The H200 call of issue 11: GPU tests, the bf16 paths-agree check, and throughput reports.
# Usage: bash benchmarks/h200_run.sh STAGE   (STAGE: check | 4b | 0.6b)
#   check: GPU tests + paths agree (qwen3-0.6b shape, 4K) + a short optimized-only throughput smoke
#   4b / 0.6b: the README throughput report for that model shape (every method, both paths, sync + async SFI)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cat DEVICE_COMMIT 2>/dev/null
case "${1:?stage}" in
final)
    # the 4b report first (what README cites), then the checks that fit in the rest of the call
    run=$OUT/throughput-qwen3-4b-h200
    python -m sfibench throughput --model qwen3-4b --ctx 8k,32k,130944 --batch 1,max \
        --methods full_kv/optimized,sfi,streaming_llm,snapkv --paths reference,optimized --steps 96 \
        --out "$run" > "$OUT/run.log" 2>&1; mv "$OUT/run.log" "$run/run.log"; tail -3 "$run/run.log"
    python benchmarks/paths_agree_gpu.py qwen3-0.6b 4096 "$OUT/paths-agree.json" 2>&1 | tail -4
    python -m sfibench profile --model qwen3-4b --ctx 130944 --method sfi --path optimized --steps 64 \
        --out "$OUT/profile" 2>&1 | tail -14
    python -m pytest -q -m gpu tests/test_graphs.py tests/test_two_segment.py -p no:cacheprovider 2>&1 | tail -3
    ;;
check)
    python -m pytest -q -m gpu tests/ -p no:cacheprovider -x 2>&1 | tail -15
    python benchmarks/paths_agree_gpu.py qwen3-0.6b 4096 "$OUT/paths-agree.json" 2>&1 | tail -6
    python -m sfibench throughput --model qwen3-4b --ctx 8k,130944 --batch 1 --steps 64 --repeats 2 \
        --methods full_kv/optimized,sfi/optimized,streaming_llm/optimized,snapkv/optimized --no-dense-kernels \
        --out "$OUT/smoke" > "$OUT/smoke.log" 2>&1; tail -25 "$OUT/smoke.log"
    ;;
4b|0.6b)
    run=$OUT/throughput-qwen3-$1-h200
    python -m sfibench throughput --model "qwen3-$1" --ctx 8k,32k,130944 --batch 1,max \
        --methods full_kv/optimized,sfi,streaming_llm,snapkv --paths reference,optimized --steps 96 --out "$run" > "$OUT/run.log" 2>&1
    cp "$OUT/run.log" "$run/run.log" 2>/dev/null
    tail -40 "$OUT/run.log"
    ;;
esac
