"""Warming L2 with the next products' weights while a decode attention kernel waits on memory latency.

At decode a small model's attention is latency-bound, not bandwidth-bound: qwen3-0.6b's fast step reads
~9 MB of K/V per layer, 2 us at copy bandwidth, in a kernel of ~8 us (reports/profile-qwen3-0.6b-optimized-
h200), so HBM idles for most of it. The products right after it (o_proj, then the MLP's gate_up and
down_proj) read weights that no kernel writes, so nothing stops the attention kernel from asking for them
early: each of its programs, before anything else, issues `prefetch.global.L2` for its share of those
weights' 128-byte lines. The instruction only hints the memory system (it returns at once, holds no
register and changes no result); when the products run, their weight tiles come from L2 instead of HBM.
An H200's L2 (50 MB) holds a small model's o_proj + gate_up + down_proj (23 MB for qwen3-0.6b) beside the
K/V the attention streams through it.

SFIBENCH_L2_PREFETCH says how many of the products after attention are warmed (MEANINGS), and only as
many of those as fit in half the device's L2 together (`chosen`): past that the later lines would evict
the earlier before their product reads them (qwen3-4b's o_proj alone is 21 MB, its gate_up 100). The hint needs
inline PTX, which the interpreter cannot run: under TRITON_INTERPRET and off CUDA it is always off, and the
kernels take the region count as a compile-time flag (0 compiles the hint out).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sfibench.switches import read_switch

ENV = "SFIBENCH_L2_PREFETCH"
MEANINGS = {"0": "off", "1": "o_proj's", "2": "o_proj's and gate_up's", "3": "o_proj's, gate_up's and down_proj's"}
DEFAULT = "0"
MAX_REGIONS = 3
LINE_BYTES = 128  # an L2 line; a prefetch names one address and brings in its line


def chosen(weights: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The leading weights (of the products after attention, in order) that an attention launch on
    `device` warms: as many as SFIBENCH_L2_PREFETCH says that fit in half its L2 together; none off CUDA
    (the interpreter has no PTX)."""
    count = int(read_switch(ENV, MEANINGS, DEFAULT))
    if device.type != "cuda" or count == 0:
        return ()
    return fitting(weights[:count], _l2_bytes(device) // 2, device)


def fitting(weights: tuple[torch.Tensor, ...], budget: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The leading `weights` whose bytes add up to at most `budget`; each must be contiguous on `device`."""
    kept, total = [], 0
    for weight in weights:
        if not weight.is_contiguous() or weight.device != device:
            raise ValueError(f"a weight to warm in L2 must be contiguous on {device}, got a "
                             f"{'strided tensor' if not weight.is_contiguous() else 'tensor'} on {weight.device}")
        total += weight.numel() * weight.element_size()
        if total > budget:
            break
        kept.append(weight)
    return tuple(kept)


@functools.cache
def _l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size


def kernel_args(weights: tuple[torch.Tensor, ...], placeholder: torch.Tensor) -> tuple[list, dict]:
    """(pointer and line-count arguments for MAX_REGIONS regions, the compile-time options) of `warm`:
    unused regions point at `placeholder` with zero lines."""
    if len(weights) > MAX_REGIONS:
        raise ValueError(f"at most {MAX_REGIONS} weights can be warmed per launch, got {len(weights)}")
    args = []
    for index in range(MAX_REGIONS):
        if index < len(weights):
            weight = weights[index]
            args += [weight, triton.cdiv(weight.numel() * weight.element_size(), LINE_BYTES)]
        else:
            args += [placeholder, 0]
    element_size = weights[0].element_size() if weights else 2
    return args, {"PREFETCH_REGIONS": len(weights), "LINE_ELEMENTS": LINE_BYTES // element_size}


@triton.jit
def _warm_region(base, n_lines, program, n_programs, LINE_ELEMENTS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's share of `n_lines` lines from `base`, one prefetch per line."""
    per_program = tl.cdiv(n_lines, n_programs)
    first = program * per_program
    end = tl.minimum(first + per_program, n_lines)
    for chunk in range(first, end, BLOCK):
        # Past the end the last line is named again: a repeated hint costs nothing and needs no mask.
        lines = tl.minimum(chunk + tl.arange(0, BLOCK), end - 1).to(tl.int64)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                  [base + lines * LINE_ELEMENTS], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def warm(base0, lines0, base1, lines1, base2, lines2, program, n_programs,
         PREFETCH_REGIONS: tl.constexpr, LINE_ELEMENTS: tl.constexpr):
    """Program `program` of `n_programs` hints its share of each region's lines into L2 (none when
    PREFETCH_REGIONS is 0)."""
    if PREFETCH_REGIONS > 0:
        _warm_region(base0, lines0, program, n_programs, LINE_ELEMENTS, 1024)
    if PREFETCH_REGIONS > 1:
        _warm_region(base1, lines1, program, n_programs, LINE_ELEMENTS, 1024)
    if PREFETCH_REGIONS > 2:
        _warm_region(base2, lines2, program, n_programs, LINE_ELEMENTS, 1024)


def describe() -> str:
    """For reports: what the attention kernels warm in L2 in this process."""
    value = read_switch(ENV, MEANINGS, DEFAULT)
    return f"{MEANINGS[value]} ({ENV}={value})" if value != "0" else f"off ({ENV}=0)"
