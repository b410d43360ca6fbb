#!/usr/bin/env bash
# Session 21's first device call (~4 min): why SFI's fast step at qwen3-0.6b 8K B=7 is ~0.015 ms slower than
# SnapKV's while reading fewer rows. benchmarks/batch_step_probe.py at B = 7 and B = 1: every timed step with
# what its rows read and the step before it, every captured graph replayed alone, the fast graph traced kernel
# by kernel. `bash benchmarks/h200_session21_probe.sh` from an export whose DEVICE_COMMIT names the tree.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
started=$SECONDS
cat DEVICE_COMMIT
mkdir -p "$OUT/probe"
timeout 420 python benchmarks/batch_step_probe.py qwen3-0.6b 8192 7,1 "$OUT/probe/probe-8k.json" \
    2>&1 | tee "$OUT/probe/stdout.log" | grep -v "^      "
echo "probe rc=$? after $((SECONDS - started)) s"
cp DEVICE_COMMIT "$OUT/probe/"
cd "$OUT" && tar -cf probe.tar probe && rm -rf probe
