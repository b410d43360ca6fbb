"""Programmatic dependent launch (PDL) for the decode step's Triton kernels.

A graphed decode step is a chain of ~220 small dependent kernels (per layer: qkv, q/k norm + RoPE +
append, attention, o_proj, gate_up, down_proj). Between two of them the GPU drains the first kernel,
then launches and ramps up the second: a few microseconds per boundary that no kernel's own speed
removes. On Hopper (compute capability 9.0) a kernel launched with PDL may start while the kernel
before it in the stream still runs; it must then wait (`griddepcontrol.wait`) before touching what that
kernel writes. The wait returns once every earlier kernel has finished and its memory is visible.

The rules every kernel here follows, so that any chain of them is race-free:
- `wait_for_inputs` comes before the first load of anything an earlier kernel of the step writes
  (activations, the newest cache slot, counters) and before the first store (an earlier kernel may
  still read what a store would overwrite);
- `release_dependents` (let the next kernel launch) comes after `wait_for_inputs`. So when a kernel
  starts early, the kernel before it has passed its own wait: everything before *that* one has
  finished, and a kernel may read, ahead of its wait, what only those kernels wrote (e.g. the
  attention kernel reads the step's lengths and selection counts, written before the layer began);
- kernels that do not opt in (cuBLAS, torch.compile's, the side stream's) launch as before; PDL
  changes nothing for them or for the kernel after them.

It is OFF unless SFIBENCH_PDL=1, because it measured as a net loss. On an H200 (qwen3-4b at 32K,
graphed steps, session 9: reports/attention-h200/pdl-ab.json) it took 0.08-0.09 ms off SFI's fast step
at B = 1 (3.16 -> 3.07 ms) but added 0.27 ms to Full-KV's step at B = 1 (4.10 -> 4.37), 1.7-1.9 ms at
B = 5 (8.73 -> 10.4-10.7) and 0.09-0.17 ms to SFI's fast step at B = 5; loading the GEMV's first weight
tile before the wait made B = 5 worse still. Not yet understood: the waiting programs of the next
kernel occupy SMs while the long dense attention kernel finishes is the first suspect. With
SFIBENCH_PDL=1, `enabled` turns it on for CUDA devices of capability >= 9 whose Triton has the
instructions. The interpreter never uses it: the kernels take `PDL` as a compile-time flag and skip
both calls when it is off.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

ENV = "SFIBENCH_PDL"


@functools.cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """Whether kernels launched for `device` use PDL (the env is read per launch, so one process can A/B it)."""
    if device.type != "cuda" or os.environ.get(ENV, "0") != "1":
        return False
    if not hasattr(tl.extra.cuda, "gdc_wait"):  # older Triton: no griddepcontrol
        return False
    return _device_supports(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device) -> dict:
    """What a launcher passes: the kernel's `PDL` flag and, when on, Triton's `launch_pdl` option."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Block until the kernels before this one in the stream have finished (no-op without PDL)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """Let the next kernel in the stream launch now (it waits for this one before reading its output)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


def describe() -> str:
    """For reports: whether this process launches with PDL on the current CUDA device."""
    if not torch.cuda.is_available():
        return "off (no CUDA device)"
    device = torch.device("cuda", torch.cuda.current_device())
    if enabled(device):
        return "on"
    if os.environ.get(ENV, "0") != "1":
        return f"off (the default; {ENV}=1 turns it on)"
    return "off (needs compute capability >= 9 and a Triton with griddepcontrol)"
