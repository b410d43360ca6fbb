#!/usr/bin/env bash
# Attention merges and the B = 5 step on the H200 (session 13): `bash benchmarks/h200_attention_run.sh` runs
# the attention and Selector kernels' tests on CUDA, sweeps the fast step's attention (splits x tile x
# where the splits merge x loop form, Qwen3-4B and 0.6B shapes), the dense kernel's merge forms
# (bench_attention --tune), the Selector's launch shapes at 128K, profiles SFI's graphed step at 128K
# B = 5. ~7 min.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
timeout 150 python -m pytest -q tests/test_kernels.py tests/test_two_segment.py tests/test_selector_kernels.py \
    tests/test_top_k_kernels.py > "$OUT/tests.log" 2>&1
rc=$?; tail -3 "$OUT/tests.log"
[ "$rc" -eq 0 ] || { echo "CUDA tests FAILED (rc=$rc)"; grep -E "^E |FAILED" "$OUT/tests.log" | head -20; }
echo "tests done after $((SECONDS - started)) s"
timeout 150 python -m sfibench.optimized.bench_fast_path --batch 1,5 --groups 4,2 --splits 3,4,8,16 \
    --block-n 32,64 --stages 4 --contexts "" --out "$OUT/fast-path-merge.json" > "$OUT/fast-path-merge.log" 2>&1
echo "fast-path sweep rc=$? after $((SECONDS - started)) s"
for b in 1 5; do for g in 4 2; do
    grep "B=$b G=$g " "$OUT/fast-path-merge.log" | sort -t: -k2 -n | head -4; done; done
timeout 120 python -m sfibench.optimized.bench_fast_path --batch "" --contexts "" --selector-tiles 130944 \
    --out "$OUT/selector-tiles.json" > "$OUT/selector-tiles.log" 2>&1
echo "selector tiles rc=$? after $((SECONDS - started)) s"
grep "^selector tiles" "$OUT/selector-tiles.log" | sort -t: -k2 -n | head -6
grep "^selector tiles SelectorTiles(stream_block=2048, block=512, chunk_blocks=2, pool_warps=4, nms_tile=256" \
    "$OUT/selector-tiles.log" | head -2
timeout 120 python -m sfibench.optimized.bench_attention --tune --batch 1,5 --contexts 32768,130944 \
    --out "$OUT/dense-merge-tune.json" > "$OUT/dense-merge-tune.log" 2>&1
echo "dense tune rc=$? after $((SECONDS - started)) s"
timeout 100 python -m sfibench profile --model qwen3-4b --ctx 130944 --batch 5 --method sfi --path optimized \
    --steps 64 --out "$OUT/profile-qwen3-4b-optimized-b5-h200" > "$OUT/profile-b5.log" 2>&1
echo "profile B=5 rc=$? after $((SECONDS - started)) s"; tail -12 "$OUT/profile-b5.log"
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
