#!/usr/bin/env bash
# Usage: bash benchmarks/h200_equal_memory.sh 32k|128k [SECONDS]
# Makes reports/throughput-qwen3-4b-equal-memory-{32k,128k}-h200: every registered method on the optimized path
# reading 15% of the context per (layer, KV head) (--budget 15%), at B = 1 (the equal-batch view) and at each
# method's own largest batch (the equal-memory view: StreamingLLM and SnapKV decode from compact caches, the
# other methods keep the whole cache). One context per call, so each context's largest batches are its own.
# Run from the repository root on the GPU with OUT set to an empty folder; the run comes back as OUT/NAME.tar,
# to unpack under reports/. DEVICE_COMMIT, when present, names the exported commit.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
case "$1" in
    32k) ctx=32768 ;;
    128k) ctx=130944 ;;  # 128K less the decode steps' room: the Qwen3 presets' limit is 131,072 tokens
    *) echo "usage: bash benchmarks/h200_equal_memory.sh 32k|128k [SECONDS]" >&2; exit 2 ;;
esac
cat DEVICE_COMMIT 2>/dev/null
name=throughput-qwen3-4b-equal-memory-$1-h200
timeout "${2:-560}" python -m sfibench throughput --model qwen3-4b --ctx "$ctx" --batch 1,max --paths optimized \
    --budget 15% --steps 64 --out "$OUT/$name" > "$OUT/run.log" 2>&1
echo "throughput rc=$?"
cp "$OUT/run.log" "$OUT/$name/run.log" 2>/dev/null
grep -v "^ *$" "$OUT/run.log" | tail -40
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
