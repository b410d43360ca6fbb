#!/usr/bin/env bash
# Session 21's last call (~5 min): the GPU regression gate against reports/ci-h200, then the optimized SFI's
# profiles at 128K (qwen3-0.6b, qwen3-4b; B = 1), each with its own time limit.
# `bash benchmarks/h200_session21_check.sh` from an export (with reports/ci-h200) whose DEVICE_COMMIT names it.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT
timeout 150 python -m sfibench check --baseline reports/ci-h200 > "$OUT/gpu-check.log" 2>&1
echo "check rc=$? after $((SECONDS - started)) s"; tail -4 "$OUT/gpu-check.log"
for model in 0.6b 4b; do
    timeout 150 python -m sfibench profile --model "qwen3-$model" --ctx 130944 --method sfi --path optimized \
        --steps 64 --out "$OUT/profile-qwen3-$model-optimized-h200" > "$OUT/profile-$model.log" 2>&1
    echo "$model profile rc=$? after $((SECONDS - started)) s"; tail -12 "$OUT/profile-$model.log"
    mv "$OUT/profile-$model.log" "$OUT/profile-qwen3-$model-optimized-h200/run.log"
done
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
