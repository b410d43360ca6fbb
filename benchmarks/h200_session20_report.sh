#!/usr/bin/env bash
# Session 20's second call (at most DEADLINE seconds, default 540): the README's qwen3-0.6b report at this tree
# (benchmarks/h200_report_run.sh, without its profile), then an A/B of the per-step token copy on qwen3-0.6b at
# 8K, B = 7, optimized path (BASE, an export of 61c5a5d, fed each step a strided column of the [B, N] token
# stream, whose copy to the GPU drains the stream; this tree feeds a contiguous pinned row,
# workloads/replay.step_inputs), then the qwen3-4b report in the time left. No profiles (of B = 1 at 128K): the
# device time left this session did not cover them.
# `BASE=../.devbase bash benchmarks/h200_session20_report.sh` from this tree's export.
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
deadline=${DEADLINE:-540}
here=$PWD
echo "this tree: $(cat DEVICE_COMMIT); base: $(cat "$BASE/DEVICE_COMMIT")"
PYTHONPATH=$here bash benchmarks/h200_report_run.sh 0.6b 240 0
echo "0.6b report done after $((SECONDS - started)) s"
for side in base new; do
    tree=$here; [ "$side" = base ] && tree=$(cd "$BASE" && pwd)
    cd "$tree" || exit 1
    PYTHONPATH=$tree timeout 60 python -m sfibench throughput --model qwen3-0.6b --ctx 8k --batch 7 \
        --methods full_kv/optimized,sfi,streaming_llm,snapkv --paths optimized --steps 64 --no-dense-kernels \
        --out "$OUT/ab-copy-$side" > "$OUT/ab-copy-$side.log" 2>&1
    echo "$side throughput rc=$? after $((SECONDS - started)) s"
    python - "$OUT/ab-copy-$side/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]["rows"]:
    floors = r.get("floor_ms") or {}
    kinds = "  ".join(f"{kind} p50 {v['p50']:.3f}" + (f" ({v['p50'] / floors[kind]:.3f}x floor {floors[kind]:.3f})"
                      if floors.get(kind) else "") for kind, v in r["ms_per_step"].items() if v and v.get("p50"))
    print(f"  {r['method']:13} {str(r.get('publish') or ''):10} B={r['batch']} {r['tokens_per_s']:8.1f} tok/s  {kinds}")
PY
    mv "$OUT/ab-copy-$side.log" "$OUT/ab-copy-$side/run.log"
    (cd "$OUT" && tar -cf "ab-copy-$side.tar" "ab-copy-$side" && rm -rf "ab-copy-$side")
done
left=$((deadline - (SECONDS - started)))
if [ "$left" -gt 200 ]; then
    cd "$here" && PYTHONPATH=$here bash benchmarks/h200_report_run.sh 4b "$left" 0
    echo "4b report done after $((SECONDS - started)) s"
else
    echo "no time left for the 4b report ($left s)"
fi
