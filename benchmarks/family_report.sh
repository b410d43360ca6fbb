#!/usr/bin/env bash
# Usage: bash benchmarks/family_report.sh [SECONDS [PART ...]]   (default: 540 seconds; 8b 14b 1.7b 32b-128k-b2)
# The Qwen3 family's throughput reports on one H200 in one device call. Each part is one `sfibench throughput`
# run: every registered method on the optimized path unless said, 64 steps x 2 timed passes, no dense-kernel
# comparison. Parts run in the order given, each stopped after its limit or at the call's end, whichever is
# sooner; a part is skipped when less time is left than it needs (its start-up, model, compile and capture
# included). The default order puts first the sizes no committed report has yet.
#   8b           qwen3-8b, 32K and 127.9K (130944 = the limit minus 128), B=1 and the largest batch
#   14b          qwen3-14b, the same
#   1.7b         qwen3-1.7b, the same
#   32b-128k-b2  qwen3-32b, 127.9K, B=2, the methods that fit there by the estimate (fit_plan.py)
#   32b          qwen3-32b, 32K and 127.9K, B=1 and the largest batch
#   32b-b2       qwen3-32b, B=2 at the longest whole-K context every method fits (fit_plan.py)
# Each finished run comes back as OUT/NAME.tar (results.json with the memory estimate beside the peak, report.md,
# plots, run.log, memory.md: benchmarks/memory_table.py's table), to unpack under reports/; OUT/family.log is
# this script's output. Run from the repository root on the GPU, OUT an empty folder.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
budget=${1:-540}
shift $(( $# > 0 ? 1 : 0 ))
parts=("${@:-8b 14b 1.7b 32b-128k-b2}")
RESERVE=10  # seconds kept for packing the last report
STEPS=64

run_part() {  # NAME NEED LIMIT ARGS...: one throughput run into OUT/NAME, packed as OUT/NAME.tar if it finishes
    local name=$1 need=$2 want=$3 left limit rc
    shift 3
    left=$(( budget - RESERVE - (SECONDS - started) ))
    if [ "$left" -lt "$need" ]; then echo "$name: skipped, ${left} s left of the ${need} s it needs"; return; fi
    limit=$(( want < left ? want : left ))
    timeout --kill-after=20 "$limit" python -m sfibench throughput --paths optimized --steps "$STEPS" --repeats 2 \
        --no-dense-kernels --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: rc=$rc after $(( SECONDS - started )) s (limit $limit s): sfibench throughput $*"
    if [ -f "$OUT/$name/results.json" ]; then
        mv "$OUT/$name.log" "$OUT/$name/run.log"
        python benchmarks/memory_table.py "$OUT/$name" > "$OUT/$name/memory.md"
        python benchmarks/memory_table.py --summary "$OUT/$name"
        tar -cf "$OUT/$name.tar" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
    else
        grep -v "^ *$" "$OUT/$name.log" | tail -12
        rm -rf "${OUT:?}/$name" "$OUT/$name.log"
    fi
}

all_parts() {
    started=$SECONDS
    cat DEVICE_COMMIT 2>/dev/null
    for part in ${parts[*]}; do
        case $part in
            8b|14b|1.7b)
                run_part "throughput-qwen3-$part-family-h200" 150 240 --model "qwen3-$part" --ctx 32k,130944 \
                    --batch 1,max ;;
            32b-128k-b2)
                methods=$(python benchmarks/fit_plan.py methods qwen3-32b 130944 2 "$STEPS")
                if [ -n "$methods" ]; then
                    run_part throughput-qwen3-32b-128k-b2-h200 150 220 --model qwen3-32b --ctx 130944 --batch 2 \
                        --methods "$methods"
                else echo "$part: no method fits at 127.9K B=2"; fi ;;
            32b) run_part throughput-qwen3-32b-family-h200 200 300 --model qwen3-32b --ctx 32k,130944 --batch 1,max ;;
            32b-b2)
                ctx=$(python benchmarks/fit_plan.py context qwen3-32b 2 "$STEPS")
                if [ "${ctx:-0}" -gt 0 ]; then
                    run_part "throughput-qwen3-32b-$(( ctx / 1000 ))k-b2-h200" 150 220 --model qwen3-32b --ctx "$ctx" \
                        --batch 2
                else echo "$part: no context fits every method at B=2"; fi ;;
            *) echo "unknown part $part; parts: 8b 14b 1.7b 32b-128k-b2 32b 32b-b2" ;;
        esac
    done
    echo "done after $(( SECONDS - started )) s"
}

all_parts 2>&1 | tee "$OUT/family.log"
