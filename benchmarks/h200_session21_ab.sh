#!/usr/bin/env bash
# Session 21's A/B (~7 min): three trees on qwen3-0.6b's graphed steps at 8K, B = 1 and 7. BASE is main before
# the changes; MID fills SFI's (and SnapKV's) compact segment to a tile edge with the window's first rows
# (sfi/state.py _rebuild_compact), so the two-segment kernel's loop-per-segment form has no padded tile; this
# tree adds the final norm folded into the LM head and float32 logits stored by its GEMV (two launches fewer
# per step, every method). First this tree's CUDA tests of the changed kernels. Run from this tree's export:
# `BASE=../.devbase MID=../.devmid bash benchmarks/h200_session21_ab.sh`.
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
here=$PWD
echo "this tree: $(cat DEVICE_COMMIT); mid: $(cat "$MID/DEVICE_COMMIT"); base: $(cat "$BASE/DEVICE_COMMIT")"
PYTHONPATH=$here timeout 200 python -m pytest -q tests/test_compact_kernels.py tests/test_gemv.py \
    tests/test_fused_kernels.py > "$OUT/cuda-tests.log" 2>&1
echo "tests rc=$? after $((SECONDS - started)) s"; tail -2 "$OUT/cuda-tests.log"
for side in base mid new base2 new2; do
    case $side in base*) tree=$(cd "$BASE" && pwd) ;; mid) tree=$(cd "$MID" && pwd) ;; *) tree=$here ;; esac
    cd "$tree" || exit 1
    PYTHONPATH=$tree timeout 100 python -m sfibench throughput --model qwen3-0.6b --ctx 8k --batch 1,7 \
        --methods full_kv/optimized,sfi,streaming_llm,snapkv --paths optimized --steps 64 --no-dense-kernels \
        --out "$OUT/ab-$side" > "$OUT/ab-$side.log" 2>&1
    echo "$side throughput rc=$? after $((SECONDS - started)) s"
    python - "$OUT/ab-$side/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]["rows"]:
    floors = r.get("floor_ms") or {}
    kinds = "  ".join(f"{kind} p50 {v['p50']:.4f}" + (f" ({v['p50'] / floors[kind]:.4f}x floor {floors[kind]:.4f})"
                      if floors.get(kind) else "") for kind, v in r["ms_per_step"].items() if v and v.get("p50"))
    print(f"  {r['method']:13} {str(r.get('publish') or ''):10} B={r['batch']} read {r['tokens_read_mean']:7.1f}  {kinds}")
PY
done
cd "$OUT" && for d in ab-*/; do d=${d%/}; mv "$d.log" "$d/run.log"; done && tar -cf ab.tar ab-* && rm -rf ab-*
