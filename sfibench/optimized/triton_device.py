"""Where the Triton kernels can run: a CUDA device, or the CPU under Triton's interpreter (the tests)."""

from __future__ import annotations

import os

import torch


def triton_runs_on(device: torch.device) -> bool:
    # TRITON_INTERPRET is Triton's own switch (it runs kernels on the CPU); the tests set it.
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def require_triton_device(device: torch.device) -> None:
    if not triton_runs_on(device):
        raise ValueError("the optimized path runs Triton kernels and needs a CUDA device; use --path reference "
                         "on this machine (tests run the kernels on the CPU with TRITON_INTERPRET=1)")
