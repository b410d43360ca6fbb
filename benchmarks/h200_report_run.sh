#!/usr/bin/env bash
# Usage: bash benchmarks/h200_report_run.sh 4b|0.6b [THROUGHPUT_SECONDS [TOTAL_SECONDS]]
# Makes reports/throughput-qwen3-{4b,0.6b}-h200 (every registered method on the optimized path, sync + async
# SFI; 8K, 32K, 128K; B = 1 and the largest batch), then, in the time left, reports/profile-qwen3-*-optimized-h200
# (the optimized SFI's graphed step at 128K). Run from the repository root on the GPU with OUT set to an
# empty folder; each run comes back as OUT/NAME.tar, to unpack under reports/. DEVICE_COMMIT, when
# present, names the exported commit.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
run=$OUT/throughput-qwen3-$1-h200
timeout "${2:-540}" python -m sfibench throughput --model "qwen3-$1" --ctx 8k,32k,130944 --batch 1,max \
    --paths optimized --steps 96 --out "$run" \
    > "$OUT/run.log" 2>&1
echo "throughput rc=$? after $((SECONDS - started)) s"
cp "$OUT/run.log" "$run/run.log" 2>/dev/null
grep -v "^ *$" "$OUT/run.log" | tail -45
left=$(( ${3:-585} - (SECONDS - started) ))
if [ "$left" -gt 60 ]; then
    timeout "$left" python -m sfibench profile --model "qwen3-$1" --ctx 130944 --method sfi --path optimized \
        --steps 64 --out "$OUT/profile-qwen3-$1-optimized-h200" > "$OUT/profile.log" 2>&1
    echo "profile rc=$? after $((SECONDS - started)) s"; tail -14 "$OUT/profile.log"
fi
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
