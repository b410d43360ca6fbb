#!/usr/bin/env bash
# One device call per model: the H200 throughput report of README, written to $OUT/throughput-MODEL-h200
# with the command's log as run.log. Usage: bash benchmarks/h200_throughput.sh qwen3-4b [--with-tests]
# (qwen3-4b takes about 5 minutes of an H200, qwen3-0.6b about 4.5; the GPU tests add 35 s).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
model=${1:?usage: h200_throughput.sh MODEL [--with-tests]}
if [[ "${2:-}" == "--with-tests" ]]; then
    python -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -3
fi
run=$OUT/throughput-$model-h200
python -m sfibench throughput --model "$model" --ctx 8k,32k,130944 --batch 1,max \
    --methods full_kv/optimized,sfi,streaming_llm,snapkv --out "$run" > "$OUT/$model.log" 2>&1
cp "$OUT/$model.log" "$run/run.log" 2>/dev/null
tail -3 "$OUT/$model.log"
sed -n '/best SDPA/,/^$/p' "$run/report.md"
