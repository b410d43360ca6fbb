#!/usr/bin/env bash
# Session 17's report call (~7 min): the qwen3-0.6b README report with the long-split table on
# (benchmarks/h200_report_run.sh, no profile), then two diagnostics for qwen3-0.6b's B = 1 steps: PDL on the
# short attention launches or not (SFIBENCH_PDL=short, the default, against products) at 8K and 32K, and the
# fast-step attention's launch shapes alone (bench_fast_path.py, B = 1, 28 layers graphed). One tar back.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
root=$OUT
started=$SECONDS
bash benchmarks/h200_report_run.sh 0.6b 330 330
mkdir -p "$root/ab-pdl"
OUT=$root/ab-pdl TESTS=tests/test_switches.py TESTS_LIMIT=30 MODEL=qwen3-0.6b CTX=8k,32k BATCH=1 LIMIT=80 \
    VARIANTS="short;products:SFIBENCH_PDL=products" bash benchmarks/h200_ab.sh
echo "A/B done after $((SECONDS - started)) s"
timeout $((590 - (SECONDS - started))) python -m sfibench.optimized.bench_fast_path --groups 2 --batch 1 \
    --splits 8,16,24 --block-n 32,64 --stages 3,4 --merge kernel --one-loop 1 --rows 2052+256 --contexts "" \
    --out "$root/fast-path-0.6b-b1.json" > "$root/fast-path-0.6b-b1.log" 2>&1
echo "sweep rc=$? after $((SECONDS - started)) s"; tail -14 "$root/fast-path-0.6b-b1.log"
cd "$root" && tar -cf session17-report.tar ./*.tar ab-pdl fast-path-0.6b-b1.* ./*.log 2>/dev/null
find "$root" -mindepth 1 -maxdepth 1 ! -name session17-report.tar -exec rm -rf {} +
