#!/usr/bin/env bash
# Usage: bash benchmarks/gpu_requests.sh [SECONDS [PART ...]]   (default: 540 seconds; test 4b-32k)
# Throughput as a serving user measures it (`sfibench throughput` request mode): requests of a long prompt and
# a long generation, every method on the optimized path with CUDA graphs, one timed request pass after the
# warm-up one (which captures the graphs). One run per part, in the order given:
#   test         first, in seconds: the request mode's GPU test (graphs per length bucket, none captured in a
#                timed pass) on a tiny model
#   4b-32k       qwen3-4b shape (random weights, so the replayed stream drives SFI's triggers), P = 32K, G = 8K,
#                B = 1 and the largest batch
#   4b-120k      the same at P = 120K (prompt + generation = the model's 128K limit)
#   coder-16k    qwen2.5-coder-1.5b with real weights (its own greedy text drives the triggers), P = 16K,
#                G = 4K, B = 1 and the largest batch; needs the GGUF staged and the gguf / transformers wheels in
#                $WHEELS (default .whl/), as for gpu_quality_real.sh (benchmarks/README.md)
# A part that does not finish within the call is stopped with SIGINT: its run keeps every finished row
# (`complete` false). Each part comes back as OUT/NAME.tar; unpack it under reports/ and call again with the
# same part: a run found at reports/NAME that is not complete is resumed (`--resume`, its recorded settings),
# so a part spread over several calls measures each row once. Resume on the same kind of card: `--batch max`
# is sized by the card's memory. BATCH (default 1,max) narrows the batches. Run from the repository root on
# the GPU, OUT an empty folder.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
budget=${1:-540}
shift $(( $# > 0 ? 1 : 0 ))
if [ $# -gt 0 ]; then parts=("$@"); else parts=(test 4b-32k); fi
RESERVE=15  # seconds kept for packing
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null | head -1
COMMON=(--paths optimized --batch "${BATCH:-1,max}" --repeats 1)

requests() {  # NAME ARGS...: one request-mode run into OUT/NAME (resuming reports/NAME), stopped at the call's end
    local name=$1 left resume=()
    shift
    left=$(( budget - RESERVE - (SECONDS - started) ))
    if [ "$left" -lt 90 ]; then echo "$name: skipped, ${left} s left"; return; fi
    if [ -f "reports/$name/results.json" ]; then
        if python -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))['results'].get('complete', True)
                      else 1)" "reports/$name/results.json"; then echo "$name: complete in reports/$name"; return; fi
        cp -r "reports/$name" "$OUT/$name" && resume=(--resume)
    fi
    timeout -s INT --kill-after=30 "$left" python -m sfibench throughput "${COMMON[@]}" --out "$OUT/$name" \
        "${resume[@]}" "$@" > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? after $(( SECONDS - started )) s (limit $left s): sfibench throughput $* ${resume[*]}"
    grep -v "^ *$" "$OUT/$name.log" | tail -14
    if [ -f "$OUT/$name/results.json" ]; then
        cat "$OUT/$name.log" >> "$OUT/$name/run.log" && rm "$OUT/$name.log"
        tar -cf "$OUT/$name.tar" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
    fi
}

for part in "${parts[@]}"; do
    case $part in
        test) timeout 300 python -m pytest -q -p no:randomly -m gpu tests/commands/test_throughput_requests.py \
                  2>&1 | tail -15 ;;
        4b-32k) requests throughput-requests-qwen3-4b-32k-8k --model qwen3-4b --prompt-len 32k --gen-len 8k ;;
        4b-120k) requests throughput-requests-qwen3-4b-120k-8k --model qwen3-4b --prompt-len 120k --gen-len 8k ;;
        coder-16k)
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
                "${WHEELS:-.whl}"/*.whl || continue
            export PYTHONPATH=$PWD:/tmp/site
            model=$(bash benchmarks/stage_parts.sh assemble qwen2.5-coder-1.5b.gguf) || continue
            requests throughput-requests-qwen2.5-coder-1.5b-16k-4k --model "$model" --dtype bfloat16 \
                --prompt-len 16k --gen-len 4k ;;
        *) echo "unknown part $part; parts: test 4b-32k 4b-120k coder-16k" ;;
    esac
done
echo "done after $(( SECONDS - started )) s"
