#!/usr/bin/env bash
# Carry a file larger than one device call allows (a GGUF model, wheels) to a GPU machine without network
# access: each call carries at most 64 MiB with the working tree counted in, but files moved outside the
# checkout stay there while the machine is warm. So: cut the file here into chunks that fit beside the
# tree, carry one chunk per call (each moved out of the checkout on arrival), then join them there and
# check the hash before anything reads the file.
#
#   here:   bash benchmarks/stage_parts.sh split FILE [NAME]
#           -> .stage/NAME/NAME.00, .01, ... and .stage/NAME/SHA256 (NAME defaults to FILE's name); prints
#              the chunk count and one carry path per line. .stage/ is git-ignored.
#   there:  bash benchmarks/stage_parts.sh receive .stage/NAME/NAME.07   (one call per chunk, with that
#           path in the call's `carry`; the SHA256 file travels with the first chunk)
#           -> moves it to $STAGE_ROOT/NAME/ (default /root/stage)
#   there:  bash benchmarks/stage_parts.sh assemble NAME [SHA256]
#           -> $STAGE_ROOT/NAME/NAME, joined in chunk order and hash-checked (SHA256 defaults to the one carried);
#              prints its path; exits 1 on a missing chunk or a wrong hash
#
# The chunk size is what fits: 64 MiB less the tree that travels (tracked and untracked, not ignored, files)
# less a 3 MiB margin, so a call never exceeds its limit as long as the tree does not grow by more.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE_ROOT=${STAGE_ROOT:-/root/stage}

tree_bytes() {  # a tracked file deleted from the tree does not travel: stat skips it
    { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } |
        awk '{s += $1} END {print s + 0}'
}

case "${1:-}" in
split)
    file=${2:?usage: stage_parts.sh split FILE [NAME]}
    name=${3:-$(basename "$file")}
    chunk=$(( 64 * 1048576 - $(tree_bytes) - 3 * 1048576 ))
    if (( chunk < 8 * 1048576 )); then
        # the committed reports alone are over what one call carries, so every device call needs them moved out
        echo "error: the working tree ($(( $(tree_bytes) / 1048576 )) MiB) leaves $((chunk / 1048576)) MiB per call;" \
            "move reports/ ($(du -sm --apparent-size reports 2>/dev/null | cut -f1) MiB) and large untracked files out of the checkout" >&2
        exit 1
    fi
    rm -rf ".stage/$name"; mkdir -p ".stage/$name"
    split -b "$chunk" -d -a 2 "$file" ".stage/$name/$name."
    sha256sum "$file" | cut -d' ' -f1 > ".stage/$name/SHA256"
    count=$(ls ".stage/$name/$name".[0-9][0-9] | wc -l)
    echo "$count chunks of at most $((chunk / 1048576)) MiB; sha256 $(cat ".stage/$name/SHA256"); carry, one per call:"
    ls ".stage/$name/$name".[0-9][0-9]
    ;;
receive)
    path=${2:?usage: stage_parts.sh receive .stage/NAME/NAME.NN}
    name=$(basename "$(dirname "$path")")
    mkdir -p "$STAGE_ROOT/$name"
    mv "$path" "$STAGE_ROOT/$name/"
    if [[ -f ".stage/$name/SHA256" ]]; then cp ".stage/$name/SHA256" "$STAGE_ROOT/$name/"; fi
    echo "$name: $(ls "$STAGE_ROOT/$name" | grep -c "^$name\.[0-9][0-9]$") chunks here"
    ;;
assemble)
    name=${2:?usage: stage_parts.sh assemble NAME [SHA256]}
    folder="$STAGE_ROOT/$name"
    expected=${3:-$(cat "$folder/SHA256" 2>/dev/null || true)}
    if [[ -z "$expected" ]]; then echo "error: no sha256 given or carried for $name" >&2; exit 1; fi
    if [[ -f "$folder/$name" ]] && echo "$expected  $folder/$name" | sha256sum -c --status; then
        echo "$folder/$name"; exit 0  # joined by an earlier call
    fi
    cat "$folder/$name".[0-9][0-9] > "$folder/$name"  # the glob sorts: .00, .01, ...
    if ! echo "$expected  $folder/$name" | sha256sum -c --status; then
        echo "error: $folder/$name does not have sha256 $expected (a chunk is missing or damaged; chunks here:" \
             "$(ls "$folder" | grep -c "^$name\.[0-9][0-9]$")); carry the missing ones again" >&2
        rm -f "$folder/$name"; exit 1
    fi
    rm -f "$folder/$name".[0-9][0-9]
    echo "$folder/$name"
    ;;
*)
    echo "usage: stage_parts.sh split FILE [NAME] | receive .stage/NAME/NAME.NN | assemble NAME [SHA256]" >&2
    exit 2
    ;;
esac
