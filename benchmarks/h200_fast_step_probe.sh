#!/usr/bin/env bash
# Why SnapKV's B = 5 step is faster than SFI's and StreamingLLM's (session 13): `bash benchmarks/h200_fast_step_probe.sh`
# times the fast-step attention kernel alone with the read split differently between the compact buffer and the
# cache's tail (SFI: 2,052 + 256-352, SnapKV: ~2,276 + 80, StreamingLLM: 4 + 2,304), in a short and a 128K cache,
# then profiles the graphed step of the three methods at 32K, B = 5. ~4 min.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
timeout 150 python -m sfibench.optimized.bench_fast_path --batch 5,1 --groups 4 --splits 3 --block-n 64 --stages 4 \
    --merge kernel --one-loop 0,1 --contexts "" \
    --rows 2052+256,2052+352,2276+80,4+2304,2052+256/130944,2276+80/130944,4+2304/130944 \
    --out "$OUT/fast-step-rows.json" > "$OUT/fast-step-rows.log" 2>&1
echo "rows sweep rc=$? after $((SECONDS - started)) s"
grep "fast-step attention" "$OUT/fast-step-rows.log"
for method in snapkv streaming_llm sfi; do
    timeout 80 python -m sfibench profile --model qwen3-4b --ctx 32k --batch 5 --method $method --path optimized \
        --steps 48 --out "$OUT/profile-$method-b5" > "$OUT/profile-$method.log" 2>&1
    echo "profile $method rc=$? after $((SECONDS - started)) s"; grep -E "│ (weights|attention|the rest|wall)" "$OUT/profile-$method.log"
done
cd "$OUT" && for d in */; do tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
