#!/usr/bin/env bash
# Issue 12's missing figure: the GPU step time of the Selector variant that keeps the most quality per
# token read (`--no-nms --keep-neighbours 7`: Soft-NMS off, the fused score max-pooled over 7 positions)
# against SFI as specified, on the optimized path (sync and async), qwen3-4b shape, 32K and 128K, B = 1
# and 5. Both runs read the same tokens, so what differs is the refresh: the slow step (sync) and the
# fast steps beside the side stream (async). `bash benchmarks/h200_variant_step_time.sh` (~5 min).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
for variant in "spec" "no-nms-keep7 --no-nms --keep-neighbours 7"; do
    set -- $variant
    name=$1; shift
    # shellcheck disable=SC2068  (the variant's flags, none quoted)
    timeout 280 python -m sfibench throughput --model qwen3-4b --ctx 32k,130944 --batch 1,5 --methods sfi \
        --paths optimized --steps 96 --no-dense-kernels $@ --out "$OUT/variant-step-time-$name" \
        > "$OUT/variant-$name.log" 2>&1
    echo "$name rc=$? after $((SECONDS - started)) s"
    cp "$OUT/variant-$name.log" "$OUT/variant-step-time-$name/run.log" 2>/dev/null
    python - "$OUT/variant-step-time-$name/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]["rows"]:
    kinds = "  ".join(f"{kind} p50 {v['p50']:.3f} p90 {v['p90']:.3f}" for kind, v in r["ms_per_step"].items()
                      if v and v.get("p50") is not None)
    print(f"  {str(r.get('publish')):10} ctx={r['context']} B={r['batch']} {r['tokens_per_s']:8.1f} tok/s  "
          f"read {r['tokens_read_mean']:.0f}  {kinds}")
PY
done
cd "$OUT" && for d in */; do [ -d "$d" ] && tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
