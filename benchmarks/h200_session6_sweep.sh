#!/usr/bin/env bash
# Session 6, first H200 call: the fast-step attention kernel's variants (split count, tile, stages,
# where splits merge, one loop over both segments or two).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cat DEVICE_COMMIT 2>/dev/null
python -m pytest -q -m gpu tests/test_two_segment.py tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -3
python -m sfibench.optimized.bench_fast_path --contexts "" --out "$OUT/fast-path-sweep.json" > "$OUT/sweep.log" 2>&1
sort -t: -k2 -n "$OUT/sweep.log" | head -3
python - "$OUT/fast-path-sweep.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["fast_step_attention"]
for key in sorted({(r["batch"], r["group"]) for r in rows}):
    mine = sorted((r for r in rows if (r["batch"], r["group"]) == key), key=lambda r: r["ms_per_step"])
    print("B=%d G=%d" % key)
    for r in mine[:6]:
        print("   %.4f ms splits=%d block_n=%d stages=%d merge_in_kernel=%s one_loop=%s" % (
            r["ms_per_step"], r["num_splits"], r["block_n"], r["num_stages"], r["merge_in_kernel"], r["one_loop"]))
    base = [r for r in mine if r["block_n"] == 64 and r["num_stages"] == 4 and not r["one_loop"]
            and r["merge_in_kernel"] == (r["num_splits"] <= 8)]
    for r in sorted(base, key=lambda r: r["num_splits"]):
        print("   today's kernel: splits=%d %.4f ms" % (r["num_splits"], r["ms_per_step"]))
PY
# It then listed one real step's kernels (benchmarks/step_kernels.py), which ran out of the call's time;
# that script is gone: `sfibench profile` already splits a step (graphed parts, or kernels with the profiler).
