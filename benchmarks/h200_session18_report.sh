#!/usr/bin/env bash
# Session 18's last call (~5 min, all the device time left): qwen3-0.6b's optimized methods at the tree with the
# fused step prologue, every context and batch of the README report (8K, 32K, 128K; B = 1 and the largest),
# into reports/throughput-qwen3-0.6b-h200-optimized (the full report, both paths, needs ~6 min more than was left).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT
run=$OUT/throughput-qwen3-0.6b-h200-optimized
timeout "${1:-270}" python -m sfibench throughput --model qwen3-0.6b --ctx 8k,32k,130944 --batch 1,max \
    --methods full_kv/optimized,sfi,streaming_llm,snapkv --paths optimized --steps 96 --out "$run" \
    > "$OUT/run.log" 2>&1
echo "throughput rc=$? after $((SECONDS - started)) s"
cp "$OUT/run.log" "$run/run.log" 2>/dev/null
grep -v "^ *$" "$OUT/run.log" | head -30
