"""Where the Triton kernels can run: a CUDA device, or the CPU under Triton's interpreter (the tests).

Imports no torch, so the command line can refuse the optimized path on a CPU before torch loads."""

from __future__ import annotations

import os


def triton_runs_on(device_type: str) -> bool:
    """`device_type`: a torch.device's type ('cuda', 'cpu')."""
    # TRITON_INTERPRET is Triton's own switch (it runs kernels on the CPU); the tests set it.
    return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def require_triton_device(device) -> None:
    if not triton_runs_on(device.type):
        raise ValueError("the optimized path runs Triton kernels and needs a CUDA device; use --path reference "
                         "on this machine (tests run the kernels on the CPU with TRITON_INTERPRET=1)")
