"""The first thing an optimized StreamingLLM or SnapKV step does, in one launch: its segments and tokens read.

Both read a fixed set plus the cache's tail through the two-segment kernel (sparse_baselines.py), which
takes the fixed set's row count per (layer, row, KV head) and the tail's first slot per row from device
tensors. StreamingLLM's move with the length: its sinks are the first min(L, n_sink) slots and its window
starts at max(L - window, sinks); SnapKV's are fixed after prefill. Then every step counts the tokens each
(layer, row, KV head) reads: the fixed rows plus the tail. In torch (`begin_tail_step_reference`, the
oracle) that is eight launches for StreamingLLM and four for SnapKV on tensors of a few hundred bytes,
each ~1.5 us before the first layer can start (an H200 trace of a qwen3-0.6b step, sfibench profile);
here one program per (layer, row) does all of it, as step_state_kernel.py does for SFI.
tests/kernels/test_tail_state_kernel.py checks the kernel against the reference under TRITON_INTERPRET=1
and on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def begin_tail_step_reference(kv_lengths: torch.Tensor, counts: torch.Tensor, tail: torch.Tensor,
                              tokens_read: torch.Tensor, sinks: tuple[int, int] | None) -> None:
    """kv_lengths `[B]`; counts `[1, L, B, H_kv]` and tail `[1, B]`, rewritten when `sinks` = (n_sink, window)
    (StreamingLLM) and read as they are when None (SnapKV); writes tokens_read `[L, B, H_kv]`."""
    if sinks is not None:
        n_sink, window = sinks
        first = kv_lengths.clamp(max=n_sink)
        counts.copy_(first[None, None, :, None].expand_as(counts))
        tail.copy_(torch.maximum(kv_lengths - window, first)[None])
    in_tail = (kv_lengths - tail[0]).clamp(min=0)
    tokens_read.copy_(counts[0] + in_tail[None, :, None])


@triton.jit
def _begin_tail_step_kernel(kv_lengths, counts, tail, tokens_read, rows, n_sink, window,
                            SINKS: tl.constexpr, KV_HEADS: tl.constexpr, BLOCK_H: tl.constexpr):
    index = tl.program_id(0)  # layer * rows + row: counts[0] and tokens_read are contiguous [L, B, H_kv]
    row = index % rows
    heads = tl.arange(0, BLOCK_H)
    in_use = heads < KV_HEADS
    length = tl.load(kv_lengths + row).to(tl.int64)
    if SINKS:  # every program computes its row's sinks and window start; layer 0's programs store the start
        first = tl.minimum(length, n_sink)
        start = tl.maximum(length - window, first)
        tl.store(counts + index * KV_HEADS + heads, first.to(counts.dtype.element_ty), mask=in_use)
        if index < rows:
            tl.store(tail + row, start.to(tail.dtype.element_ty))
        fixed = tl.zeros([BLOCK_H], tl.int64) + first
    else:
        start = tl.load(tail + row).to(tl.int64)
        fixed = tl.load(counts + index * KV_HEADS + heads, mask=in_use, other=0).to(tl.int64)
    read = fixed + tl.maximum(length - start, 0)
    tl.store(tokens_read + index * KV_HEADS + heads, read.to(tokens_read.dtype.element_ty), mask=in_use)


def begin_tail_step(kv_lengths: torch.Tensor, counts: torch.Tensor, tail: torch.Tensor,
                    tokens_read: torch.Tensor, sinks: tuple[int, int] | None) -> None:
    """begin_tail_step_reference in one launch (same arguments, same results)."""
    _, layers, rows, kv_heads = counts.shape
    if counts.shape[0] != 1 or tail.shape != (1, rows) or tokens_read.shape != (layers, rows, kv_heads) \
            or kv_lengths.shape != (rows,):
        raise ValueError(f"begin_tail_step takes counts [1, L, B, H_kv], tail [1, B], tokens_read "
                         f"[L, B, H_kv] and kv_lengths [B]; got {tuple(counts.shape)}, {tuple(tail.shape)}, "
                         f"{tuple(tokens_read.shape)}, {tuple(kv_lengths.shape)}")
    if not all(tensor.is_contiguous() for tensor in (kv_lengths, counts, tail, tokens_read)):
        raise ValueError("begin_tail_step indexes its tensors as contiguous; pass contiguous ones")
    n_sink, window = sinks if sinks is not None else (0, 0)
    _begin_tail_step_kernel[(layers * rows,)](
        kv_lengths, counts, tail, tokens_read, rows, n_sink, window, SINKS=sinks is not None,
        KV_HEADS=kv_heads, BLOCK_H=triton.next_power_of_2(kv_heads), num_warps=1)
