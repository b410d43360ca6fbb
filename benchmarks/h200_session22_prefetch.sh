#!/usr/bin/env bash
# Session 22's tenth device call (~3 min): the qkv kernel's CUDA tests (its L2 prefetch now compiles), then
# benchmarks/launch_floor_probe.py at qwen3-0.6b (then qwen3-4b, time allowing), 8K, B = 1, with
# SFIBENCH_L2_PREFETCH's modes interleaved (PROBE_PREFETCH). `bash benchmarks/h200_session22_prefetch.sh` from
# an export whose DEVICE_COMMIT names the tree: 87ac263, where SFIBENCH_L2_PREFETCH exists (reverted in
# a7c7e0b).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT
mkdir -p "$OUT/prefetch"
timeout 60 python -m pytest -q tests/test_qkv_epilogue.py > "$OUT/prefetch/cuda-tests.log" 2>&1
echo "cuda tests rc=$? after $((SECONDS - started)) s"; tail -3 "$OUT/prefetch/cuda-tests.log"
for model in qwen3-0.6b qwen3-4b; do
    left=$(( 250 - (SECONDS - started) ))
    [ "$left" -gt 40 ] || break
    PROBE_PREFETCH=1 timeout "$left" python benchmarks/launch_floor_probe.py "$model" 8192 64,2308 \
        "$OUT/prefetch/launch-floor-prefetch-$model-8k.json" 2>&1 | tee "$OUT/prefetch/launch-floor-prefetch-$model.log"
    echo "$model probe rc=$? after $((SECONDS - started)) s"
done
cp DEVICE_COMMIT "$OUT/prefetch/"
cd "$OUT" && tar -cf prefetch.tar prefetch && rm -rf prefetch
