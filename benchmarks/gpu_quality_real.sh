#!/usr/bin/env bash
# Usage: bash benchmarks/gpu_quality_real.sh SECONDS PART[@TASKS][:LIMIT] ...
#   (TASKS: that part's comma-separated task list where it takes one; LIMIT: that part's seconds)
# Quality of every method with a real instruct model (Qwen2.5-Coder-1.5B-Instruct, every layer attending) on a
# GPU machine without network access, in one device call: reports/quality-qwen2.5-coder-1.5b-*.
#
# Staging, before this call (benchmarks/README.md): the GGUF carried in chunks by stage_parts.sh under the
# name qwen2.5-coder-1.5b.gguf, and the gguf wheel (a newer transformers wheel optional) in $WHEELS (default
# .whl/, carried with this call). Each part is one `sfibench quality` run on the optimized path in bfloat16 with
# CUDA graphs (agree-8k: three runs), stopped with SIGINT at its limit (the run keeps and renders what is done)
# or skipped when less time is left than it needs; each comes back as OUT/NAME.tar, to unpack under reports/.
#   list-CTX     niah_list (one sentence per value, a slow step per sentence) at CTX (8k, 16k, 32k), every method
#                at paper-2k
#   reason-CTX   niah_reason and vt_reason (reasoning before the answer) at CTX (8k, 16k, 32k = 31,992), every
#                method at paper-2k (@TASKS overrides)
#   reason-retention-16k  niah_reason at 16K, every method at retention 0.15 and 0.5 (@TASKS overrides)
#   grid-CTX     niah_single, niah_multikey, niah_multivalue, niah_multiquery at CTX (8k, 16k, 32k), every method
#                at paper-2k and paper-4k (@TASKS overrides the task list)
#   retention-CTX  niah_single at CTX (8k, 16k, 32k), every method at retention 0.15 and 0.5 (@TASKS overrides)
#   retention-list-16k  niah_list at 16K, every method at retention 0.15 and 0.5 ($LIST_SAMPLES prompts)
#   variants-CTX SFI --no-nms and SFI --no-nms --keep-neighbours 7 on niah_single at CTX (paper-2k, paper-4k;
#                @TASKS overrides the task list)
#   variants-retention-CTX  the same two SFI variants at retention 0.15 and 0.5 (@TASKS as for variants-CTX)
#   variants-list-16k  the same two SFI variants on niah_list at 16K (paper-2k, $LIST_SAMPLES prompts)
#   refresh-CTX  the refresh's ablation: SFI --no-nms --keep-neighbours 7 with --trigger bootstrap (the prompt's
#                selection for the whole answer) beside SnapKV, then the same SFI with its refresh on, on niah_list
#                at CTX (8k, 16k, 32k), paper-2k, $LIST_SAMPLES prompts (@TASKS overrides, e.g. @niah_list_32)
#   refresh-retention-16k  the same pair at 16K, at retention 0.15 and 0.5 instead of paper-2k
#   ruler-CTX    RULER's 13 tasks at CTX (8k, 16k, 32k: the model's limit), every method at paper-2k
#                ($RULER_SAMPLES prompts per task; @TASKS picks some, e.g. @ruler_qa_1,ruler_qa_2)
#   ruler-retention-16k  the same at 16K, every method at retention 0.15 and 0.5 (@TASKS as above)
#   longfid-16k  niah_list_64 (answers of >= 1,024 tokens) at 16K, every method at paper-2k, batch 8
#   agree-8k     niah_single at 8K, 20 prompts: optimized bfloat16, reference bfloat16, reference float32
# Environment: TASKS (the task list of every part without @TASKS), SAMPLES (default 100), LIST_SAMPLES (64), RULER_SAMPLES (20), BATCH (default 16), WHEELS (the wheels),
# VARIANTS (the variants-* parts' runs, in order: default "no-nms no-nms-keep7"; one of them where time is short).
set -uo pipefail
export PYTHONUNBUFFERED=1
budget=${1:?usage: gpu_quality_real.sh SECONDS PART...}
shift
started=$SECONDS
RESERVE=15  # seconds kept for packing
cat DEVICE_COMMIT 2>/dev/null | head -1
# RULER's package and word lists (ruler-CTX), staged once per warm machine by a call that carries them:
#   mkdir -p /root/stage && cp -r .stage/ruler-wheels /root/stage/   (carry .stage/ruler-wheels, 18 MB)
ruler_wheels=$(ls "${RULER_WHEELS:-/root/stage/ruler-wheels}"/*.whl 2>/dev/null)
# shellcheck disable=SC2086  # one path per wheel
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${WHEELS:-.whl}"/*.whl $ruler_wheels || exit 1
export PYTHONPATH=$PWD:/tmp/site
# A carried transformers installs with --no-deps, so it can need a newer huggingface-hub than the machine has
# (transformers 5.25 needs >= 2.4); then the machine's own transformers (>= 5.17, pyproject) reads the model.
if ! python -c 'import transformers' 2>/dev/null; then
    echo "the carried transformers does not import here (it needs newer dependencies): using the machine's own"
    rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
fi
model=$(bash benchmarks/stage_parts.sh assemble qwen2.5-coder-1.5b.gguf) || exit 1
echo "model $model; $(python -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__)')"
METHODS=full_kv,sfi,streaming_llm,snapkv,quest,tidaldecode
SAMPLES=${SAMPLES:-100}
BATCH=${BATCH:-16}
DEFAULT_TASKS=${TASKS:-}
LIST_SAMPLES=${LIST_SAMPLES:-64}
RULER_SAMPLES=${RULER_SAMPLES:-20}

quality() {  # NAME NEED ARGS...: one quality run into OUT/NAME with SIGINT at its limit
    local name=$1 need=$2 left limit
    shift 2
    left=$(( budget - RESERVE - (SECONDS - started) ))
    if [ "$left" -lt "$need" ]; then echo "$name: skipped, ${left} s left of the ${need} s it needs"; return; fi
    limit=$(( ${PARTLIMIT:-$left} < left ? ${PARTLIMIT:-$left} : left ))  # PARTLIMIT: the part's own LIMIT
    timeout -s INT --kill-after=30 "$limit" python -m sfibench quality --model "$model" --device cuda \
        --batch "$BATCH" --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? after $(( SECONDS - started )) s (limit $limit s): sfibench quality $*"
    grep -v "^ *$" "$OUT/$name.log" | tail -4
    if [ -d "$OUT/$name" ]; then mv "$OUT/$name.log" "$OUT/$name/run.log"; fi
}

pack() {  # NAME [DIR ...]: OUT/NAME.tar of the given run folders (default OUT/NAME)
    local name=$1
    shift
    local dirs=("${@:-$name}") present=()
    for d in "${dirs[@]}"; do [ -d "$OUT/$d" ] && present+=("$d"); done
    [ ${#present[@]} -gt 0 ] && tar -cf "$OUT/$name.tar" -C "$OUT" "${present[@]}" && (cd "$OUT" && rm -rf "${present[@]}")
}

budget_points() {  # PART PRESETS: sets points: retention 0.15 and 0.5 for a *-retention-* part, else PRESETS
    if [[ $1 == *-retention-* ]]; then points=(--budget 0.15,0.5); else points=(--sfi-preset "$2"); fi
}

OPT=(--path optimized --dtype bfloat16)
for spec in "$@"; do
    part=${spec%%:*}
    PARTLIMIT=$( [[ $spec == *:* ]] && echo "${spec#*:}" || echo "" )
    TASKS=$( [[ $part == *@* ]] && echo "${part#*@}" || echo "${DEFAULT_TASKS:-}" )
    part=${part%%@*}
    case $part in
    list-8k | list-16k | list-32k)
        ctx=${part#list-}; [ "$ctx" = 32k ] && ctx=32000
        quality "$part" 120 "${OPT[@]}" --tasks niah_list --ctx "$ctx" --sfi-preset paper-2k --methods "$METHODS" \
            --samples "$SAMPLES"; pack "$part" ;;
    reason-8k | reason-16k | reason-32k)
        # 31,992: the longest prompt that leaves the reasoning answer's 768-token cap and an 8-token margin
        ctx=${part#reason-}; [ "$ctx" = 32k ] && ctx=31992
        quality "$part" 120 "${OPT[@]}" --tasks "${TASKS:-niah_reason,vt_reason}" --ctx "$ctx" --sfi-preset paper-2k \
            --methods "$METHODS" --samples "$SAMPLES"; pack "$part" ;;
    reason-retention-16k)
        quality "$part" 120 "${OPT[@]}" --tasks "${TASKS:-niah_reason}" --ctx 16k --budget 0.15,0.5 \
            --methods "$METHODS" --samples "$SAMPLES"; pack "$part" ;;
    grid-8k | grid-16k | grid-32k)
        ctx=${part#grid-}; [ "$ctx" = 32k ] && ctx=32000
        quality "$part" 120 "${OPT[@]}" --tasks "${TASKS:-niah_single,niah_multikey,niah_multivalue,niah_multiquery}" \
            --ctx "$ctx" --sfi-preset paper-2k,paper-4k --methods "$METHODS" --samples "$SAMPLES"; pack "$part" ;;
    retention-8k | retention-16k | retention-32k)
        ctx=${part#retention-}; [ "$ctx" = 32k ] && ctx=32000
        quality "$part" 120 "${OPT[@]}" --tasks "${TASKS:-niah_single}" --ctx "$ctx" --budget 0.15,0.5 \
            --methods "$METHODS" --samples "$SAMPLES"; pack "$part" ;;
    retention-list-16k)
        quality "$part" 120 "${OPT[@]}" --tasks niah_list --ctx 16k --budget 0.15,0.5 \
            --methods "$METHODS" --samples "$LIST_SAMPLES"; pack "$part" ;;
    variants-8k | variants-16k | variants-32k | variants-list-16k | variants-retention-8k | variants-retention-16k \
    | variants-retention-32k)
        ctx=${part##*-}; [ "$ctx" = 32k ] && ctx=32000
        task=${TASKS:-niah_single}; n=$SAMPLES; budget_points "$part" paper-2k,paper-4k
        [[ $part == variants-list-* ]] && { task=niah_list; points=(--sfi-preset paper-2k); n=$LIST_SAMPLES; }
        for variant in ${VARIANTS:-no-nms no-nms-keep7}; do
            case $variant in
            no-nms) flags=(--no-nms) ;;
            no-nms-keep7) flags=(--no-nms --keep-neighbours 7) ;;
            *) echo "unknown variant $variant (VARIANTS takes no-nms, no-nms-keep7)"; continue ;;
            esac
            quality "$part-$variant" 90 "${OPT[@]}" --tasks "$task" --ctx "$ctx" "${points[@]}" \
                --methods sfi "${flags[@]}" --samples "$n"
        done
        pack "$part" "$part-no-nms" "$part-no-nms-keep7" ;;
    refresh-8k | refresh-16k | refresh-32k | refresh-retention-16k)
        ctx=${part##*-}; [ "$ctx" = 32k ] && ctx=32000
        budget_points "$part" paper-2k
        variant=(--tasks "${TASKS:-niah_list}" --ctx "$ctx" "${points[@]}" --no-nms --keep-neighbours 7
            --samples "$LIST_SAMPLES")
        quality "$part-off" 90 "${OPT[@]}" "${variant[@]}" --methods sfi,snapkv --trigger bootstrap
        quality "$part-on" 90 "${OPT[@]}" "${variant[@]}" --methods sfi
        pack "$part" "$part-off" "$part-on" ;;
    ruler-8k | ruler-16k | ruler-32k | ruler-retention-16k)
        # RULER's 32K is the model's whole context less sfibench's 8-token margin; a preset needs it as a number
        ctx=${part##*-}; [ "$ctx" = 32k ] && ctx=32760
        budget_points "$part" paper-2k
        quality "$part" 120 "${OPT[@]}" --tasks "${TASKS:-ruler}" --ctx "$ctx" "${points[@]}" \
            --methods "$METHODS" --samples "$RULER_SAMPLES"; pack "$part" ;;
    longfid-16k)
        BATCH=8 quality "$part" 120 "${OPT[@]}" --tasks niah_list_64 --ctx 16k --sfi-preset paper-2k \
            --methods "$METHODS" --samples 16; pack "$part" ;;
    agree-8k)
        for run in "optimized bfloat16" "reference bfloat16" "reference float32"; do
            read -r path dtype <<< "$run"
            quality "$part-$path-$dtype" 60 --path "$path" --dtype "$dtype" --tasks niah_single --ctx 8k \
                --sfi-preset paper-2k --methods "$METHODS" --samples 20
        done
        if [ -d "$OUT/$part-reference-float32" ]; then
            python benchmarks/quality_paths_agree.py "$OUT/$part-reference-float32" "$OUT/$part-reference-bfloat16" \
                "$OUT/$part-reference-bfloat16" "$OUT/$part-optimized-bfloat16" --out "$OUT/$part-agreement.md"
        fi
        pack "$part" "$part-reference-float32" "$part-reference-bfloat16" "$part-optimized-bfloat16" ;;
    *) echo "unknown part $part" ;;
    esac
done
echo "done after $(( SECONDS - started )) s"
