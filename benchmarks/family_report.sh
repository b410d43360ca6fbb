#!/usr/bin/env bash
# Usage: bash benchmarks/family_report.sh SIZE [SECONDS]   (SIZE: 0.6b 1.7b 4b 8b 14b 32b; one size per call,
# as one call of the device runner may last 10 minutes). Makes OUT/throughput-qwen3-SIZE-family-h200 (Full-KV,
# SFI sync + async, StreamingLLM and SnapKV on the optimized path; 32K and 128K (130944 = the limit minus the
# steps); B = 1 and the largest batch the memory estimate allows), then prints estimate against peak for
# each row (benchmarks/memory_table.py). Run from the repository root on the GPU with OUT set to an empty
# folder; the run comes back as OUT/NAME.tar, to unpack under reports/.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
run=$OUT/throughput-qwen3-$1-family-h200
timeout "${2:-560}" python -m sfibench throughput --model "qwen3-$1" --ctx 32k,130944 --batch 1,max \
    --paths optimized --steps 64 --repeats 2 --no-dense-kernels --out "$run" > "$OUT/run.log" 2>&1
echo "throughput rc=$? after $((SECONDS - started)) s"
cp "$OUT/run.log" "$run/run.log" 2>/dev/null
grep -v "^ *$" "$OUT/run.log" | tail -30
python benchmarks/memory_table.py "$run"
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
