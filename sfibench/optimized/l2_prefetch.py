"""Pulling a layer's next weights into L2 while its attention runs (SFIBENCH_L2_PREFETCH).

At B = 1 a layer's attention launch is latency-bound: it reads a few MB of K/V in ~8 us and leaves the
memory bus mostly idle, while the three products after it (o_proj, gate_up, down_proj) each wait on
DRAM round trips for their weights. The qkv kernel, just before the attention, knows those weights: each
of its programs issues `prefetch.global.L2` for its share of their cache lines after its own product (a
hint: no register waits on it, no value changes), so that the products after the attention find their
weights in L2. The weights floor (metrics/floor.py) is the chain of products alone, with no attention to
hide behind; it runs without this. On CUDA only: the interpreter has no inline assembly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sfibench.switches import read_switch

ENV = "SFIBENCH_L2_PREFETCH"
MODES = {"0": "off", "o_proj": "the qkv kernel prefetches the layer's o_proj weight",
         "layer": "the qkv kernel prefetches the layer's o_proj, gate_up and down_proj weights"}
# Globals a Triton kernel reads must be constexpr instances (an annotation is not enough)
LINE = tl.constexpr(128)  # bytes per L2 line
BLOCK_LINES = tl.constexpr(512)  # lines a program issues per loop step


def mode() -> str:
    return read_switch(ENV, MODES, "0")


def describe() -> str:
    return f"{MODES[mode()]} ({ENV}={mode()})"


def weights_after_attention(o_proj: torch.Tensor, gate_up: torch.Tensor | None, down: torch.Tensor) -> tuple:
    """What SFIBENCH_L2_PREFETCH asks the qkv kernel to prefetch, from the layer's weights in use order, as
    long as they fit in half the device's L2 (the attention's K/V passes through the other half)."""
    chosen = mode()
    if chosen == "0" or o_proj.device.type != "cuda":
        return ()
    room = torch.cuda.get_device_properties(o_proj.device).L2_cache_size // 2
    chosen_weights = []
    for weight in (o_proj,) if chosen == "o_proj" else (o_proj, gate_up, down):
        if weight is None:
            continue
        room -= weight.numel() * weight.element_size()
        if room < 0:
            break
        chosen_weights.append(weight)
    return tuple(chosen_weights)


@triton.jit
def _prefetch_lines(pointers):
    """prefetch.global.L2::evict_last for each pointer; the zero it returns is only there because inline
    assembly must return a value."""
    return tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\t"
                                     "mov.u32 $0, 0;", "=r,l", [pointers], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def share(base, lines, program, programs):
    """Program `program` of `programs` prefetches its contiguous share of `lines` lines from byte pointer
    `base`. Out-of-range lines are clamped to the last one (a repeated prefetch costs nothing)."""
    per = tl.cdiv(lines, programs)
    first = program * per
    for start in range(first, first + per, BLOCK_LINES):
        line = tl.minimum(start + tl.arange(0, BLOCK_LINES), lines - 1).to(tl.int64)
        _prefetch_lines(base + line * LINE)


def kernel_args(weights: tuple, placeholder: torch.Tensor) -> dict:
    """The kernel's prefetch arguments for up to three weights (contiguous, on one CUDA device)."""
    if len(weights) > 3:
        raise ValueError(f"at most three weights can be prefetched, got {len(weights)}")
    args = {"PREFETCH": len(weights)}
    for name, index in zip("abc", range(3)):
        if index < len(weights):
            weight = weights[index]
            if not weight.is_contiguous():
                raise ValueError("a prefetched weight must be contiguous")
            args[f"prefetch_{name}"] = weight.view(torch.uint8).view(-1)  # byte addresses
            args[f"lines_{name}"] = triton.cdiv(weight.numel() * weight.element_size(), LINE.value)
        else:
            args[f"prefetch_{name}"], args[f"lines_{name}"] = placeholder, 1
    return args
