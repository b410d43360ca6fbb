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

Which kernels opt in was set by measurement (H200, graphed decode steps). PDL on every kernel sped up
SFI's fast step but slowed Full-KV's dense read; PDL on the products (the GEMVs and the q/k kernel) alone
sped up both; the attention kernels gain from it only when their splits are short. A dense read's programs
(one per SM, each thousands of rows) placed while the kernel before still holds SMs can land two to an SM
and leave another idle for the whole read; short splits (a few hundred rows each) mostly gain the
overlapped start. So the products and those attention launches whose splits are short (the caller says so:
two_segment.fast_read_launch, by the rule that also picks its one-loop form) launch with PDL, dense reads
without. `enabled` turns PDL on only for CUDA devices of capability >= 9 whose Triton has the
instructions. The interpreter never uses it: the kernels take `PDL` as a compile-time flag and skip both
calls when it is off.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Which kernels may launch with PDL: "products" are the GEMVs and the q/k kernel, "short_attention" the
# split attention kernels (and their merge) of a launch whose splits are short, "attention" those of any
# other launch (dense reads), which launch without it.
KINDS = ("products", "short_attention", "attention")
WITH_PDL = frozenset({"products", "short_attention"})


@functools.cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device, kind: str = "products") -> bool:
    """Whether `kind` kernels (one of KINDS) launched for `device` use PDL."""
    if kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; one of {', '.join(KINDS)}")
    if kind not in WITH_PDL or device.type != "cuda":
        return False
    if not hasattr(tl.extra.cuda, "gdc_wait"):  # older Triton: no griddepcontrol
        return False
    return _device_supports(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device, kind: str) -> dict:
    """What a launcher passes: the kernel's `PDL` flag and, when on, Triton's `launch_pdl` option."""
    return {"PDL": True, "launch_pdl": True} if enabled(device, kind) else {"PDL": False}


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
    """For reports: which Triton decode kernels this process launches with PDL on the current CUDA device."""
    if not torch.cuda.is_available():
        return "off (no CUDA device)"
    device = torch.device("cuda", torch.cuda.current_device())
    names = {"products": "the GEMVs and the q/k kernel",
             "short_attention": "attention launches of short splits", "attention": "dense attention launches"}
    kinds = [names[kind] for kind in KINDS if enabled(device, kind)]
    if kinds:
        return f"on for {', '.join(kinds)}"
    return "off (needs compute capability >= 9 and a Triton with griddepcontrol)"
