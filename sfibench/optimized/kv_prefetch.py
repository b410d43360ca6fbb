"""A fast step's K/V asked into L2 before the attention kernel waits for the kernel before it.

With programmatic dependent launch (pdl.py) a fast step's attention programs can start while the qkv product
still runs, and they already read their row counts and tail starts there (INDEX_BEFORE_WAIT), so each program
knows which K/V rows its split will read before it may read the queries. Everything it reads except the
step's own slot was written by earlier steps, so nothing stops it from asking for those rows early: each
program issues `prefetch.global.L2` for every 128-byte line of its split's K and V rows, then waits. The
instruction only hints the memory system (it returns at once, holds no register or shared memory and changes
no result; L2 is where every write lands, so a line of the slot the qkv kernel is still writing is never
stale). Session 17 loaded a split's first tile into registers before the wait instead, which cost the
loop its pipelining and made the step slower (reports/attention-h200/session17); this leaves the loop as is.

At qwen3-0.6b's B = 1 the attention kernel takes ~9 us a layer for ~2 us of K/V bytes, and ~3.4 us of it is
the reads themselves (reports/attention-h200/session18: the same launch reading 20 rows takes 5.8 us).
SFIBENCH_KV_PREFETCH switches it (MEANINGS); it needs inline PTX, which the interpreter cannot run, so under
TRITON_INTERPRET and off CUDA it is always off and the kernel takes it as a compile-time flag.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sfibench.switches import read_switch

ENV = "SFIBENCH_KV_PREFETCH"
MEANINGS = {"1": "each short split hints its K/V lines into L2 before the PDL wait", "0": "off"}
DEFAULT = "1"
LINE_BYTES = 128  # an L2 line; a prefetch names one address and brings in its line


def enabled(device: torch.device) -> bool:
    """Whether short-split launches on `device` prefetch (SFIBENCH_KV_PREFETCH; never off CUDA)."""
    return read_switch(ENV, MEANINGS, DEFAULT) == "1" and device.type == "cuda"


def describe() -> str:
    value = read_switch(ENV, MEANINGS, DEFAULT)
    return f"{MEANINGS[value]} ({ENV}={value})"


def line_constants(head_dim: int, element_size: int) -> dict:
    """The kernel's compile-time line geometry: 128-byte lines per K/V row and elements per line."""
    return {"ROW_LINES": max(1, head_dim * element_size // LINE_BYTES),
            "LINE_ELEMENTS": max(1, LINE_BYTES // element_size)}


@triton.jit
def hint_rows(base, stride_row, first, last, ROW_LINES: tl.constexpr, LINE_ELEMENTS: tl.constexpr,
              BLOCK: tl.constexpr = 256):
    """Hint rows [first, last) of a row-major region (rows `stride_row` elements apart) into L2, line by line."""
    n_lines = (last - first) * ROW_LINES
    for chunk in range(0, n_lines, BLOCK):
        # Past the end the last line is named again: a repeated hint costs nothing and needs no mask.
        index = tl.minimum(chunk + tl.arange(0, BLOCK), n_lines - 1)
        row = (first + index // ROW_LINES).to(tl.int64)
        address = base + row * stride_row + (index % ROW_LINES) * LINE_ELEMENTS
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [address], dtype=tl.int32,
                                  is_pure=False, pack=1)
