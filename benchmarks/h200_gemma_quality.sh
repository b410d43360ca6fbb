#!/usr/bin/env bash
# Usage: bash benchmarks/h200_gemma_quality.sh SECONDS CONTEXTS   (e.g. 540 16384,31744)
# Gemma-3-270M quality on an H200 machine without network access: reports/quality-gemma3-*-h200*.
# Stages the model as h200_gemma_stage.sh says (the GGUF in parts under /root/g, the wheels in ../.whl),
# then runs `sfibench quality` at each context (one run per context: the authors' presets fix the
# budget in tokens) while time is left, writing OUT/quality-gemma3-CTX-h200TAG.tar.
# Environment: TASKS (default niah_single,niah_multiturn); EXTRA replaces the methods list, e.g.
# EXTRA="--methods sfi --no-nms --keep-neighbours 7" TAG=-no-nms-keep7; RESUME=DIR continues a stopped
# run with --resume.
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
source benchmarks/h200_gemma_stage.sh  # sets $model
for ctx in $(echo "${2:-16384,31744,8192}" | tr , " "); do
    left=$(( ${1:-540} - (SECONDS - started) ))
    [ "$left" -lt 40 ] && { echo "no time left for $ctx"; break; }
    out="$OUT/quality-gemma3-$ctx-h200${TAG:-}"
    resume=()
    if [ -n "${RESUME:-}" ]; then cp -r "$RESUME" "$out" && resume=(--resume); fi
    # shellcheck disable=SC2086  (EXTRA is a list of flags)
    timeout "$left" python -m sfibench quality --model "$model" --tasks "${TASKS:-niah_single,niah_multiturn}" --ctx "$ctx" \
        --sfi-preset paper-2k,paper-4k ${EXTRA:---methods full_kv,sfi,streaming_llm,snapkv} --samples 20 --batch 4 \
        --no-chat --device cuda --dtype float32 --out "$out" "${resume[@]}" > "$OUT/quality-$ctx.log" 2>&1
    echo "ctx $ctx rc=$? after $((SECONDS - started)) s"
    grep -v "^ *$" "$OUT/quality-$ctx.log" | tail -12
done
cd "$OUT" && for d in */; do [ -d "$d" ] && tar -cf "${d%/}.tar" "$d" && rm -rf "$d"; done
