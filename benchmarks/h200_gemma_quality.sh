#!/usr/bin/env bash
# Usage: bash benchmarks/h200_gemma_quality.sh SECONDS CONTEXTS   (e.g. 540 16384,31744)
# Gemma-3-270M quality on an H200 machine without network access: reports/quality-gemma3-*-h200*.
# Expects the GGUF in parts under /root/g (g.00, g.01, ...: `split -n 6 -d -a 2 GGUF g.`, since one
# device call carries at most 64 MiB), and ../.whl holding the gguf-0.19.0 and transformers-5.23.0 wheels:
# transformers 5.17 converts Gemma-3's GGUF tokenizer into two-character pieces
# (reports/diagnostics/gemma3-h200-mismatch), which sfibench refuses at load. Assembles and checks the
# file, then runs `sfibench quality` at each context (one run per context: the authors' presets fix the
# budget in tokens) while time is left, writing OUT/quality-gemma3-CTX-h200TAG.tar.
# Environment: TASKS (default niah_single,niah_multiturn); EXTRA replaces the methods list, e.g.
# EXTRA="--methods sfi --no-nms --keep-neighbours 7" TAG=-no-nms-keep7; RESUME=DIR continues a stopped
# run with --resume.
set -uo pipefail
export PYTHONUNBUFFERED=1
started=$SECONDS
cat DEVICE_COMMIT 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
python -c "import transformers; print('transformers', transformers.__version__)"
model=/root/g/gemma-3-270m-q4_k_m.gguf
cat /root/g/g.[0-9][0-9] > "$model" || exit 1  # the glob sorts: g.00, g.01, ...
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $model" | sha256sum -c || exit 1
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
