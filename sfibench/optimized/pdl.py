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

It is OFF unless asked for (SFIBENCH_PDL=1: every kernel; =products: see MODES), because it measured
as a net loss. On an H200 (qwen3-4b at 32K, graphed steps, session 9: reports/ab-qwen3-4b-32k-h200) it
took 0.08-0.09 ms off SFI's fast step at B = 1 (3.16 -> 3.07 ms) but added 0.27 ms to Full-KV's step at
B = 1 (4.10 -> 4.37), 1.7-1.9 ms at B = 5 (8.73 -> 10.4-10.7) and 0.09-0.17 ms to SFI's fast step at
B = 5; loading the GEMV's first weight tile before the wait made B = 5 worse still. Not yet understood;
the `products` mode tests the first suspect (MODES). When asked for, `enabled` turns it on for CUDA
devices of capability >= 9 whose Triton has the instructions. The interpreter never uses it: the kernels
take `PDL` as a compile-time flag and skip both calls when it is off.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sfibench.switches import read_switch

ENV = "SFIBENCH_PDL"
# Which kernels launch with PDL, per value of SFIBENCH_PDL: "products" are the GEMVs and the q/k kernel,
# "attention" the split attention kernels and their merge. `products` leaves attention out to test the
# suspicion above: a kernel of one program per SM whose programs are placed while the previous kernel
# still holds SMs may get two programs on one SM and none on another.
MODES = {"0": frozenset(), "1": frozenset({"products", "attention"}), "products": frozenset({"products"})}
MEANINGS = {"0": "off, the default", "1": "every Triton decode kernel",
            "products": "the GEMVs and the q/k kernel only"}


@functools.cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def mode() -> str:
    """SFIBENCH_PDL's value ("0" when unset), refused when it is not one of MODES."""
    return read_switch(ENV, MEANINGS, "0")


def enabled(device: torch.device, kind: str = "products") -> bool:
    """Whether `kind` kernels ("products" or "attention") launched for `device` use PDL. The env is read per
    launch, so one process can A/B it."""
    if kind not in MODES["1"]:
        raise ValueError(f"unknown kernel kind {kind!r}; one of {sorted(MODES['1'])}")
    if kind not in MODES[mode()] or device.type != "cuda":
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
    kinds = [kind for kind in ("products", "attention") if enabled(device, kind)]
    if kinds:
        return "on for " + " and ".join({"products": "the GEMVs and the q/k kernel",
                                         "attention": "the attention kernels"}[kind] for kind in kinds)
    if mode() == "0":
        return f"off (the default; {ENV}=1 or products turns it on)"
    return "off (needs compute capability >= 9 and a Triton with griddepcontrol)"
