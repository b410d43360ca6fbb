#!/usr/bin/env bash
# Session 18's second A/B call (~9 min): two trees with the same benchmarks/h200_ab.sh settings, interleaved:
# BASE (default ../.devbase: a git archive of the tree before this session's step changes, 832eda7) and this
# one, which adds
#   (a) the step's first launches fused: layer_kernels.decode_inputs (embedding, sums of squares and the RoPE rows
#       in one launch, every method) and tail_state_kernel.py (StreamingLLM's and SnapKV's bookkeeping in one);
#   (b) qwen3-4b B=5's long-split shape in two_segment.LONG_SPLIT_SHAPES (3 stages): `new-default-long` turns the
#       table off (SFIBENCH_LONG_SPLITS=default);
#   (c) short splits hinting their K/V into L2 before the PDL wait (kv_prefetch.py): `no-prefetch` turns it off
#       (SFIBENCH_KV_PREFETCH=0), `early` also releases the attention at the qkv kernel's start
#       (SFIBENCH_QKV_EARLY_RELEASE=1; B = 1 only, where the hint applies).
# It ran at 2ba6307: (a) and (b) were kept; (c) made B = 1 steps slower (reports/attention-h200/session18) and
# was removed, so on later trees the `no-prefetch` and `early` runs set switches that no longer exist.
# First the CUDA tests of the new kernels. Shapes: qwen3-0.6b 8K/32K B=1,7 (every optimized method), qwen3-4b 32K
# B=1,5 (Full-KV, SFI, StreamingLLM).
set -uo pipefail
root=$OUT; here=$PWD; base=${BASE:-$here/../.devbase}
new_tests="tests/test_tail_state_kernel.py tests/test_fused_kernels.py::test_decode_inputs_matches_reference
    tests/test_two_segment.py::test_the_kv_prefetch_changes_no_result
    tests/test_qkv_epilogue.py::test_where_the_next_kernel_is_released_changes_no_result
    tests/test_fused_kernels.py::test_decoder_with_folded_input_norms_matches_torch"
small="MODEL=qwen3-0.6b CTX=8k,32k LIMIT=110 METHODS=full_kv/optimized,sfi,streaming_llm,snapkv"
large="MODEL=qwen3-4b CTX=32k BATCH=1,5 LIMIT=100 METHODS=full_kv/optimized,sfi,streaming_llm"
run() {  # run TREE OUT_DIR TESTS TESTS_LIMIT VARIANTS SETTINGS...
    local tree=$1 out=$2 tests=$3 limit=$4 variants=$5; shift 5
    mkdir -p "$out"
    (cd "$tree" && env OUT="$out" TESTS="$tests" TESTS_LIMIT="$limit" VARIANTS="$variants" "$@" \
        bash benchmarks/h200_ab.sh)
}
# shellcheck disable=SC2086  (the settings lists)
run "$here" "$root/new-0.6b" "$new_tests" 70 "new;no-prefetch:SFIBENCH_KV_PREFETCH=0" $small BATCH=1,7
run "$base" "$root/base-0.6b" tests/test_switches.py 20 base $small BATCH=1,7
run "$here" "$root/early-0.6b" tests/test_switches.py 20 "early:SFIBENCH_QKV_EARLY_RELEASE=1" $small BATCH=1
run "$base" "$root/base-4b" tests/test_switches.py 20 base $large
run "$here" "$root/new-4b" tests/test_switches.py 20 "new;new-default-long:SFIBENCH_LONG_SPLITS=default" $large
cd "$root" && tar -cf session18-step.tar ./*-0.6b ./*-4b && rm -rf ./*-0.6b ./*-4b
