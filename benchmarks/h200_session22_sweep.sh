#!/usr/bin/env bash
# Session 22's ninth device call (the third that ran; ~5 min): the CUDA tests of the qkv kernel (with its L2
# prefetch), then benchmarks/launch_floor_probe.py at qwen3-0.6b and qwen3-4b, 8K, B = 1, with the fast-step
# kernel's launch swept in whole graphed steps (PROBE_SWEEP: splits, tile rows, stages, warps; PROBE_SWEEP_PDL:
# attention without PDL) and SFIBENCH_L2_PREFETCH's modes (PROBE_PREFETCH). `bash
# benchmarks/h200_session22_sweep.sh` from an export whose DEVICE_COMMIT names the tree. SFIBENCH_L2_PREFETCH
# and PROBE_PREFETCH exist only in that call's tree (2a6de40; reverted in a7c7e0b).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT
mkdir -p "$OUT/sweep"
timeout 100 python -m pytest -q tests/test_qkv_epilogue.py > "$OUT/sweep/cuda-tests.log" 2>&1
echo "cuda tests rc=$? after $((SECONDS - started)) s"; tail -3 "$OUT/sweep/cuda-tests.log"
export PROBE_PREFETCH=1 PROBE_SWEEP_PDL=1 PROBE_SWEEP="16:64:4:4,16:64:3:4,16:64:2:4,16:32:4:4,16:32:3:4,16:64:4:8,16:64:4:2,\
32:32:3:4,32:32:2:4,32:64:2:4,24:32:3:4,8:64:4:8,8:128:2:8,16:64:4:4"
for model in qwen3-0.6b qwen3-4b; do
    timeout 220 python benchmarks/launch_floor_probe.py "$model" 8192 64,2308 \
        "$OUT/sweep/launch-floor-sweep-$model-8k.json" 2>&1 | tee "$OUT/sweep/launch-floor-sweep-$model.log"
    echo "$model probe rc=$? after $((SECONDS - started)) s"
done
cp DEVICE_COMMIT "$OUT/sweep/"
cd "$OUT" && tar -cf sweep.tar sweep && rm -rf sweep
