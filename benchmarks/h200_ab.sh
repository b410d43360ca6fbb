#!/usr/bin/env bash
# An A/B of decoder variants on the 4B shape at 32K, B = 1 and 5 (Full-KV and SFI, optimized), after the
# Triton kernels' tests on CUDA: `bash benchmarks/h200_ab.sh` (~7 min with the default four variants).
# Each variant is "SFIBENCH_PDL SFIBENCH_QKV_EPILOGUE name"; VARIANTS (';'-separated) and TESTS (test files)
# override the defaults, e.g. VARIANTS="0 0 off;0 1 qkv-epilogue" TESTS="tests/test_qkv_epilogue.py".
# Session 9 ran it (as h200_session9_ab.sh) with PDL 0 / 1 (reports/ab-qwen3-4b-32k-h200); session 10 with
# the default list: off, PDL for the GEMVs and q/k kernel only, PDL for every kernel, and the qkv product
# carrying q/k norm + RoPE + append (optimized/qkv_epilogue.py, PDL off).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
tests=${TESTS:-tests/test_gemv.py tests/test_fused_kernels.py tests/test_graphs.py tests/test_floor.py \
    tests/test_two_segment.py tests/test_kernels.py tests/test_qkv_epilogue.py}
# shellcheck disable=SC2086  (a list of files)
timeout 240 python -m pytest -q $tests > "$OUT/tests.log" 2>&1
rc=$?; tail -3 "$OUT/tests.log"
[ "$rc" -eq 0 ] || { echo "CUDA tests FAILED (rc=$rc): the A/B below is for diagnosis only"; \
    grep -E "^E |FAILED" "$OUT/tests.log" | head -20; }
echo "tests done after $((SECONDS - started)) s"
IFS=';' read -ra variants <<< "${VARIANTS:-0 0 off;products 0 products;1 0 on;0 1 qkv-epilogue}"
for variant in "${variants[@]}"; do
    set -- $variant
    SFIBENCH_PDL=$1 SFIBENCH_QKV_EPILOGUE=$2 timeout 150 python -m sfibench throughput \
        --model qwen3-4b \
        --ctx 32k --batch 1,5 --methods full_kv/optimized,sfi --paths optimized --steps 64 --no-dense-kernels \
        --out "$OUT/ab-$3" > "$OUT/ab-$3.log" 2>&1
    echo "$3 rc=$? after $((SECONDS - started)) s"
    python - "$OUT/ab-$3/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]["rows"]:
    kinds = "  ".join(f"{kind} p50 {v['p50']:.3f} p90 {v['p90']:.3f}" for kind, v in r["ms_per_step"].items()
                      if v and v.get("p50") is not None)
    print(f"  {r['method']:8} {str(r.get('publish') or ''):10} B={r['batch']} {r['tokens_per_s']:8.1f} tok/s  {kinds}")
PY
done
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
