#!/usr/bin/env bash
# The Selector's kernels on the H200 (session 12): `bash benchmarks/h200_selector_run.sh` runs the Triton
# Selector's tests on CUDA, times one refresh at 32K and 128K (kernel by kernel, the radix top-K against
# torch.topk) and (TILES=1) the Selector's launch shapes at 128K, then the 4B throughput at CTX (default
# 128K), B = 1 and 5, Full-KV and SFI (optimized, sync and async), with today's defaults; with BRIDGE=N,
# SFI at 128K B = 1 once more with N bridge steps. ~4-6 min.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
timeout 200 python -m pytest -q tests/test_selector_kernels.py tests/test_top_k_kernels.py \
    tests/test_two_segment.py tests/test_compact_kernels.py > "$OUT/tests.log" 2>&1
rc=$?; tail -3 "$OUT/tests.log"
[ "$rc" -eq 0 ] || { echo "CUDA tests FAILED (rc=$rc)"; grep -E "^E |FAILED" "$OUT/tests.log" | head -20; }
echo "tests done after $((SECONDS - started)) s"
timeout 200 python -m sfibench.optimized.bench_fast_path --batch "" --contexts 32768,130944 \
    --selector-tiles "$([ "${TILES:-0}" = 1 ] && echo 130944)" --out "$OUT/refresh-parts.json" > "$OUT/refresh-parts.log" 2>&1
echo "bench_fast_path rc=$? after $((SECONDS - started)) s"
grep -v "^selector tiles" "$OUT/refresh-parts.log" | tail -40
grep "^selector tiles" "$OUT/refresh-parts.log" | sort -t: -k2 -n | head -8
timeout 240 python -m sfibench throughput --model qwen3-4b --ctx "${CTX:-130944}" --batch 1,5 \
    --methods full_kv/optimized,sfi --paths optimized --steps 96 --no-dense-kernels \
    --out "$OUT/throughput" > "$OUT/throughput.log" 2>&1
echo "throughput rc=$? after $((SECONDS - started)) s"
grep -E "^\| (full_kv|sfi)" "$OUT/throughput/report.md" | head -24
if [ -n "${BRIDGE:-}" ]; then
    timeout 120 python -m sfibench throughput --model qwen3-4b --ctx 130944 --batch 1 --methods sfi \
        --paths optimized --steps 96 --no-dense-kernels --bridge-steps "$BRIDGE" \
        --out "$OUT/throughput-128k-bridge$BRIDGE" > "$OUT/bridge.log" 2>&1
    echo "bridge rc=$? after $((SECONDS - started)) s"
    grep -E "^\| sfi" "$OUT/throughput-128k-bridge$BRIDGE/report.md" | head -8
fi
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
