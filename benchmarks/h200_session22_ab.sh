#!/usr/bin/env bash
# Session 22's second device call (~5 min): benchmarks/launch_floor_probe.py with PROBE_AB=1 at qwen3-0.6b and
# qwen3-4b, 8K, B = 1 (the qkv epilogue's modes "1" and "head", interleaved; fast-step split counts), after
# the CUDA tests of the qkv epilogue and the fused decoder. `bash benchmarks/h200_session22_ab.sh` from an
# export whose DEVICE_COMMIT names the tree: e7351c0, where SFIBENCH_QKV_EPILOGUE=head exists (reverted in
# e760eb4).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT
mkdir -p "$OUT/ab"
timeout 150 python -m pytest -q tests/test_qkv_epilogue.py tests/test_fused_kernels.py > "$OUT/ab/cuda-tests.log" 2>&1
echo "cuda tests rc=$? after $((SECONDS - started)) s"; tail -3 "$OUT/ab/cuda-tests.log"
for model in qwen3-0.6b qwen3-4b; do
    PROBE_AB=1 timeout 200 python benchmarks/launch_floor_probe.py "$model" 8192 64,2308 \
        "$OUT/ab/launch-floor-ab-$model-8k.json" 2>&1 | tee "$OUT/ab/launch-floor-ab-$model.log"
    echo "$model probe rc=$? after $((SECONDS - started)) s"
done
cp DEVICE_COMMIT "$OUT/ab/"
cd "$OUT" && tar -cf ab.tar ab && rm -rf ab
