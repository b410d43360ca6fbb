#!/usr/bin/env bash
# Device call that finishes issue 6: the GPU tests, then the qwen3-0.6b throughput report with the
# tuned Full-KV kernel (about 5 minutes of an H200). Copy $OUT/throughput-qwen3-0.6b-h200 over
# reports/throughput-qwen3-0.6b-h200 afterwards and update reports/README.md.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -3
python -m sfibench throughput --model qwen3-0.6b --ctx 8k,32k,130944 --batch 1,max \
    --methods full_kv/optimized,sfi,streaming_llm,snapkv --out $OUT/throughput-qwen3-0.6b-h200 \
    > $OUT/throughput-qwen3-0.6b-h200.log 2>&1
cp $OUT/throughput-qwen3-0.6b-h200.log $OUT/throughput-qwen3-0.6b-h200/run.log 2>/dev/null
tail -3 $OUT/throughput-qwen3-0.6b-h200.log
sed -n '/best SDPA/,/^$/p' $OUT/throughput-qwen3-0.6b-h200/report.md
