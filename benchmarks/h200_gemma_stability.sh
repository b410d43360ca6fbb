#!/usr/bin/env bash
# Usage: bash benchmarks/h200_gemma_stability.sh SECONDS   (e.g. 540)
# Gemma-3-270M attention-support stability at 8K, 16K and 32K on an H200 machine without network access:
# reports/stability-gemma3-h200 (the shipped prose teacher-forced, and needle prompts the model answers)
# and reports/stability-gemma3-h200-generated (the model's own continuation of the prose). Both compare
# every registered method's memory and SFI with --no-nms --keep-neighbours 7 at SFI's tokens read, and
# the sentence trigger against a fixed interval at its rate. Stages the model as h200_gemma_stage.sh
# says, runs each analysis while time is left and writes OUT/NAME.tar (its log inside as run.log).
# Environment: STEPS (decode steps per segment, default 512), SAMPLES (needle prompts per context,
# default 1), CONTEXTS (default 8k,16k,32k).
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
source benchmarks/h200_gemma_stage.sh  # sets $model
common=(--model "$model" --ctx "${CONTEXTS:-8k,16k,32k}" --steps "${STEPS:-512}" --fixed-refresh auto --no-nms
        --keep-neighbours 7 --device cuda --dtype float32)
runs=("stability-gemma3-h200|--prompts prose,niah_single --samples ${SAMPLES:-1}"
      "stability-gemma3-h200-generated|--prompts prose --generate")
for run in "${runs[@]}"; do
    name=${run%%|*}
    left=$(( ${1:-540} - (SECONDS - started) ))
    [ "$left" -lt 60 ] && { echo "no time left for $name"; break; }
    # shellcheck disable=SC2086  (the run's own flags are a list)
    timeout "$left" python -m sfibench stability "${common[@]}" ${run#*|} --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? after $((SECONDS - started)) s"
    grep -v "^ *$" "$OUT/$name.log" | tail -14
    [ -d "$OUT/$name" ] && cp "$OUT/$name.log" "$OUT/$name/run.log"  # the report keeps the command's own log
done
cd "$OUT" && for d in */; do [ -d "$d" ] && tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
