#!/usr/bin/env bash
# An A/B of decoder variants on the 4B shape (MODEL) at 32K, B = 1 and 5 (Full-KV and SFI, optimized),
# after the Triton kernels' tests on CUDA: `bash benchmarks/h200_ab.sh` (~4 min with the default two variants).
# VARIANTS is ';'-separated, each "name" or "name:VAR=value,VAR=value" (environment of that run), e.g.
# VARIANTS="default;no-fold:SFIBENCH_FOLD_INPUT_NORM=0;pdl:SFIBENCH_PDL=1"; TESTS overrides the test files.
# Session 9 ran it (as h200_session9_ab.sh) with PDL 0 / 1 (reports/ab-qwen3-4b-32k-h200); session 10
# (variants then written "SFIBENCH_PDL SFIBENCH_QKV_EPILOGUE name") with off / PDL products / PDL all / the
# qkv epilogue; session 11 with off / the input norm folded into the qkv product (then opt-in, now the
# default). The default now: today's decoder against the fold turned off. CTX, METHODS and LIMIT (seconds
# per variant) widen a run, e.g. the straddling split's loop (optimized/two_segment.py, STRADDLE_ENV):
# CTX=32k,130944 METHODS=full_kv/optimized,sfi,streaming_llm,snapkv LIMIT=170 TESTS=tests/test_two_segment.py
# VARIANTS="default;straddle:SFIBENCH_STRADDLE_ONE_LOOP=1;slow:SFIBENCH_STRADDLE_ONE_LOOP=slow" bash benchmarks/h200_ab.sh
# TESTS_LIMIT (seconds, default 240) bounds the CUDA tests; MODEL (default qwen3-4b) and BATCH (1,5) set
# the shape, e.g. session 15's A/B of narrow products on the Triton GEMV (the default since) or cuBLAS
# (optimized/gemv.py, NARROW_ENV): MODEL=qwen3-0.6b CTX=32k,130944 METHODS=full_kv/optimized,sfi,streaming_llm,snapkv
# VARIANTS="default;cublas:SFIBENCH_NARROW_GEMV=cublas" bash benchmarks/h200_ab.sh
# Session 16 (at ca0c118, whose attention kernels could hint the next products' weights into L2, a switch
# removed after this A/B: reports/attention-h200/session16/README.md) ran MODEL=qwen3-0.6b CTX=8k,32k BATCH=1,7
# VARIANTS="default;l2-1:SFIBENCH_L2_PREFETCH=1;l2-2:SFIBENCH_L2_PREFETCH=2;l2-3:SFIBENCH_L2_PREFETCH=3".
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
tests=${TESTS:-tests/test_gemv.py tests/test_layer_kernels.py tests/test_fused_kernels.py tests/test_graphs.py \
    tests/test_floor.py tests/test_two_segment.py tests/test_kernels.py tests/test_qkv_epilogue.py}
# shellcheck disable=SC2086  (a list of files)
timeout "${TESTS_LIMIT:-240}" python -m pytest -q $tests > "$OUT/tests.log" 2>&1
rc=$?; tail -3 "$OUT/tests.log"
[ "$rc" -eq 0 ] || { echo "CUDA tests FAILED (rc=$rc): the A/B below is for diagnosis only"; \
    grep -E "^E |FAILED" "$OUT/tests.log" | head -20; }
echo "tests done after $((SECONDS - started)) s"
IFS=';' read -ra variants <<< "${VARIANTS:-default;no-fold:SFIBENCH_FOLD_INPUT_NORM=0}"
for variant in "${variants[@]}"; do
    name=${variant%%:*}
    settings=()
    [[ "$variant" == *:* ]] && IFS=',' read -ra settings <<< "${variant#*:}"
    env "${settings[@]}" timeout "${LIMIT:-150}" python -m sfibench throughput \
        --model "${MODEL:-qwen3-4b}" --ctx "${CTX:-32k}" --batch "${BATCH:-1,5}" \
        --methods "${METHODS:-full_kv/optimized,sfi}" \
        --paths optimized --steps 64 --no-dense-kernels \
        --out "$OUT/ab-$name" > "$OUT/ab-$name.log" 2>&1
    echo "$name rc=$? after $((SECONDS - started)) s"
    python - "$OUT/ab-$name/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]["rows"]:
    floors = r.get("floor_ms") or {}
    kinds = "  ".join(f"{kind} p50 {v['p50']:.3f} p90 {v['p90']:.3f}"
                      + (f" ({v['p50'] / floors[kind]:.3f}x floor {floors[kind]:.3f})" if floors.get(kind) else "")
                      for kind, v in r["ms_per_step"].items() if v and v.get("p50") is not None)
    print(f"  {r['method']:8} {str(r.get('publish') or ''):10} ctx={r['context']} B={r['batch']} "
          f"{r['tokens_per_s']:8.1f} tok/s  {kinds}")
PY
done
# One tar per variant, its command's log inside as run.log: the device tool brings back only a few files per call.
cd "$OUT" && for d in */; do
    [ -f "${d%/}.log" ] && mv "${d%/}.log" "$d/run.log"
    tar -cf "${d%/}.tar" "$d" && rm -rf "$d"
done
