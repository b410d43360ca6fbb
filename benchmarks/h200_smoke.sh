#!/usr/bin/env bash
# First call on a lent GPU: the GPU-only tests, then a short throughput run at a real shape.
# Runs from the repository root on the device machine; writes logs and the run under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
python -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -30 | tee $OUT/gpu_tests.txt
python -m sfibench throughput --model qwen3-0.6b --ctx 8k --batch 1 --steps 32 --repeats 1 \
    --out $OUT/smoke --overwrite 2>&1 | tail -40
