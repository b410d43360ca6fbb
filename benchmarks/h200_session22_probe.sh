#!/usr/bin/env bash
# Session 22's first device call (~7 min): what a launch-bound B = 1 step is made of, and the profiles.
# benchmarks/launch_floor_probe.py at qwen3-0.6b and qwen3-4b, 8K, B = 1 (the step without attention, with one
# minimal launch per layer, and with the fast-step kernel at four budgets, against the weights floor); then the
# two README profiles (B = 1, 128K) re-made at this code. `bash benchmarks/h200_session22_probe.sh` from an
# export whose DEVICE_COMMIT names the tree.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT
mkdir -p "$OUT/probe"
for model in qwen3-0.6b qwen3-4b; do
    timeout 150 python benchmarks/launch_floor_probe.py "$model" 8192 64,512,1152,2308 \
        "$OUT/probe/launch-floor-$model-8k.json" 2>&1 | tee "$OUT/probe/launch-floor-$model.log"
    echo "$model probe rc=$? after $((SECONDS - started)) s"
done
cp DEVICE_COMMIT "$OUT/probe/"
for model in qwen3-0.6b qwen3-4b; do
    left=$(( 560 - (SECONDS - started) ))
    [ "$left" -gt 60 ] || break
    timeout "$left" python -m sfibench profile --model "$model" --ctx 130944 --method sfi --path optimized \
        --steps 64 --out "$OUT/profile-$model-optimized-h200" > "$OUT/probe/profile-$model.log" 2>&1
    echo "$model profile rc=$? after $((SECONDS - started)) s"; tail -14 "$OUT/probe/profile-$model.log"
done
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
