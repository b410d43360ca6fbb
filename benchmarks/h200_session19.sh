#!/usr/bin/env bash
# Session 19's first device call (~9 min): the kernels changed since their last CUDA run (decode_inputs' kernel
# after 462219f's indexing change, the tail-state kernel, the two-segment kernel) tested on CUDA, then the
# README's qwen3-0.6b throughput report at this tree (benchmarks/h200_report_run.sh; its profile at 128K too
# when the report leaves time, as it did), then the GPU regression gate against reports/ci-h200. Each part has
# its own time limit; the logs come back beside the report's tar. `bash benchmarks/h200_session19.sh` from an export whose DEVICE_COMMIT names the tree.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
root=$OUT
started=$SECONDS
cat DEVICE_COMMIT
timeout 120 python -m pytest -q tests/test_fused_kernels.py tests/test_tail_state_kernel.py \
    tests/test_two_segment.py > "$root/cuda-tests.log" 2>&1
echo "tests rc=$? after $((SECONDS - started)) s"; tail -3 "$root/cuda-tests.log"
bash benchmarks/h200_report_run.sh 0.6b 330 330
echo "report done after $((SECONDS - started)) s"
timeout 120 python -m sfibench check --baseline reports/ci-h200 > "$root/gpu-check.log" 2>&1
echo "check rc=$? after $((SECONDS - started)) s"; tail -4 "$root/gpu-check.log"
