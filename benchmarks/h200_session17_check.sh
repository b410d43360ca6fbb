#!/usr/bin/env bash
# Session 17's last call (~6 min): the two-segment kernel's and the paths-agree tests on CUDA at the tree that
# holds the long-split table, the GPU regression gate against reports/ci-h200 (qwen3-0.6b, B = 1: code paths
# this session did not change, so it should pass), and a diagnostic for the B = 7 sparse steps still above
# 1.25x their floor: the straddling split in one loop (SFIBENCH_STRADDLE_ONE_LOOP=1) at 0.6B 8K B = 7.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
root=$OUT
started=$SECONDS
cat DEVICE_COMMIT
timeout 200 python -m pytest -q tests/test_two_segment.py tests/test_paths_agree.py \
    --deselect tests/test_paths_agree.py::test_paths_agree_on_smollm2 > "$root/cuda-tests.log" 2>&1
echo "tests rc=$? after $((SECONDS - started)) s"; tail -3 "$root/cuda-tests.log"
timeout 200 python -m sfibench check --baseline reports/ci-h200 > "$root/gpu-check.log" 2>&1
echo "check rc=$? after $((SECONDS - started)) s"; tail -4 "$root/gpu-check.log"
mkdir -p "$root/ab-straddle"
OUT=$root/ab-straddle TESTS=tests/test_switches.py TESTS_LIMIT=30 MODEL=qwen3-0.6b CTX=8k BATCH=7 LIMIT=70 \
    METHODS=streaming_llm/optimized,snapkv/optimized,sfi VARIANTS="default;straddle:SFIBENCH_STRADDLE_ONE_LOOP=1" \
    bash benchmarks/h200_ab.sh
cd "$root" && tar -cf session17-check.tar ./*.log ab-straddle && rm -rf ab-straddle ./*.log
