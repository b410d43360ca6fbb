#!/usr/bin/env bash
# Session 20's A/B (~6 min): the base tree (BASE, an export of main before the change) against this one, on
# qwen3-0.6b's sparse steps. The change: with a loop per segment, the two-segment kernel pads the compact rows
# to whole tiles in its index space (optimized/two_segment.py), and SFI copies its step masks only when they
# change (sfi/method.py send_mask). First this tree's two-segment tests on CUDA; then, per tree, the fast-step
# attention alone (bench_fast_path: B = 7 at 4 splits as the tuned table launches it, qwen3-4b's B = 5 at 3),
# then whole graphed steps (`sfibench throughput`, optimized path, 8K, B = 1 and 7). Run from this tree's
# export: `BASE=../.devbase bash benchmarks/h200_session20_ab.sh`.
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
here=$PWD
echo "this tree: $(cat DEVICE_COMMIT); base: $(cat "$BASE/DEVICE_COMMIT")"
PYTHONPATH=$here timeout 120 python -m pytest -q tests/test_two_segment.py > "$OUT/cuda-tests.log" 2>&1
echo "tests rc=$? after $((SECONDS - started)) s"; tail -2 "$OUT/cuda-tests.log"
for side in base new; do
    tree=$here; [ "$side" = base ] && tree=$(cd "$BASE" && pwd)
    cd "$tree" || exit 1
    PYTHONPATH=$tree timeout 90 python -m sfibench.optimized.bench_fast_path --batch 7 --groups 2 --splits 4 \
        --block-n 64 --stages 3 --merge kernel --one-loop 0 --rows 4+2304/8448,2052+304/8448,2052+560/8448 \
        --contexts "" --out "$OUT/fast-path-b7-$side.json" > "$OUT/fast-path-$side.log" 2>&1
    PYTHONPATH=$tree timeout 60 python -m sfibench.optimized.bench_fast_path --batch 5 --groups 4 --splits 3 \
        --block-n 64 --stages 3 --merge kernel --one-loop 0 --rows 4+2304/8448,2052+560/8448 \
        --contexts "" --out "$OUT/fast-path-4b-b5-$side.json" >> "$OUT/fast-path-$side.log" 2>&1
    echo "$side fast path rc=$? after $((SECONDS - started)) s"; grep "^fast-step" "$OUT/fast-path-$side.log"
done
for side in base new base2 new2; do
    tree=$here; [[ "$side" = base* ]] && tree=$(cd "$BASE" && pwd)
    cd "$tree" || exit 1
    PYTHONPATH=$tree timeout 100 python -m sfibench throughput --model qwen3-0.6b --ctx 8k --batch 1,7 \
        --methods full_kv/optimized,sfi,streaming_llm,snapkv --paths optimized --steps 64 --no-dense-kernels \
        --out "$OUT/ab-$side" > "$OUT/ab-$side.log" 2>&1
    echo "$side throughput rc=$? after $((SECONDS - started)) s"
    python - "$OUT/ab-$side/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]["rows"]:
    floors = r.get("floor_ms") or {}
    kinds = "  ".join(f"{kind} p50 {v['p50']:.3f}" + (f" ({v['p50'] / floors[kind]:.3f}x floor {floors[kind]:.3f})"
                      if floors.get(kind) else "") for kind, v in r["ms_per_step"].items() if v and v.get("p50"))
    print(f"  {r['method']:13} {str(r.get('publish') or ''):10} B={r['batch']} {r['tokens_per_s']:8.1f} tok/s  {kinds}")
PY
done
cd "$OUT" && for d in */; do [ -f "${d%/}.log" ] && mv "${d%/}.log" "$d/run.log"; tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
