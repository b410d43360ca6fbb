#!/usr/bin/env bash
# Session 18's A/B call (one device call, ~8 min): the kernels this session touched on CUDA, then where the step's
# q/k norm, RoPE and KV append run: in the attention kernel (SFIBENCH_QKV_IN_ATTENTION=1, optimized/new_token.py,
# `attention`) against the qkv product's epilogue (=0, optimized/qkv_epilogue.py, `epilogue`), for every optimized
# method: qwen3-0.6b at 8K and 32K, B = 1 and 7, then qwen3-4b at 32K, B = 1 and 5, each through
# benchmarks/h200_ab.sh. Everything comes back as one tar. It ran at 69fb2e0; moving the work into attention
# measured no faster at B = 1 and slower in batched slow steps, so it was reverted (reports/attention-h200/session18/):
# on later trees SFIBENCH_QKV_IN_ATTENTION is unknown and the `attention` variant does not exist.
set -uo pipefail
root=$OUT
mkdir -p "$root/ab-0.6b" "$root/ab-4b"
OUT=$root/ab-0.6b TESTS="tests/test_new_token.py tests/test_two_segment.py tests/test_paths_agree.py \
    --deselect tests/test_paths_agree.py::test_paths_agree_on_smollm2" \
    TESTS_LIMIT=150 MODEL=qwen3-0.6b CTX=8k,32k BATCH=1,7 LIMIT=110 \
    METHODS=full_kv/optimized,sfi,streaming_llm,snapkv \
    VARIANTS="attention:SFIBENCH_QKV_IN_ATTENTION=1;epilogue:SFIBENCH_QKV_IN_ATTENTION=0" \
    bash benchmarks/h200_ab.sh
OUT=$root/ab-4b TESTS=tests/test_switches.py TESTS_LIMIT=30 MODEL=qwen3-4b CTX=32k BATCH=1,5 LIMIT=100 \
    METHODS=full_kv/optimized,sfi,streaming_llm \
    VARIANTS="attention:SFIBENCH_QKV_IN_ATTENTION=1;epilogue:SFIBENCH_QKV_IN_ATTENTION=0" bash benchmarks/h200_ab.sh
cd "$root" && tar -cf session18-ab.tar ab-0.6b ab-4b && rm -rf ab-0.6b ab-4b
