"""The compact rebuild of a refresh in one Triton launch.

After the Selector picks K positions per (layer, KV head), the optimized fast step wants those tokens'
K/V (after the sinks, and followed by the recent window's first rows up to a tile edge) contiguous in a
compact buffer. The PyTorch reference (sfi/state.gather_compact) gathers the rows into a temporary with
`index_select` and then scatters the temporary into the buffer with an indexed assignment: four passes
over ~340 MB at 128K on Qwen3-4B (36 layers x 8 KV heads x ~2,300 rows x 128 x K and V), and the indexed
assignment runs far below copy bandwidth (the whole publish + rebuild took 1.4 ms on the H200). Here one
program per (layer, KV head, block of rows) reads each row once from the cache and writes it once into
the buffer: the bytes a gather must move.

The grid depends on the refresh's host integers (sink count, picks per head); the refresh is not
captured in a graph, so that is fine.
tests/kernels/test_compact_kernels.py checks it against the reference under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 64  # compact rows per program: 64 x 128 x 2 bytes = 16 KB of K and 16 KB of V in flight


@triton.jit
def _gather_compact_kernel(k_cache, v_cache, compact_k, compact_v, layers_ptr, picks_ptr, sinks, picked,
                           window_start, window_rows,
                           stride_cl, stride_ch, stride_cs, stride_pl, stride_ph, stride_pr,
                           stride_kn, stride_kh, stride_kk,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    index = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    # compact rows: sinks first, then picks, then the window's first rows
    rows = tl.program_id(2) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    layer = tl.load(layers_ptr + index).to(tl.int64)  # int64: offsets into a large cache exceed 2**31
    in_use = rows < sinks + picked + window_rows
    is_pick = (rows >= sinks) & (rows < sinks + picked)
    pick = tl.load(picks_ptr + index.to(tl.int64) * stride_kn + head * stride_kh + (rows - sinks) * stride_kk,
                   mask=is_pick, other=0)
    position = tl.where(rows < sinks, rows, tl.where(is_pick, pick, window_start + rows - sinks - picked))
    position = position.to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    mask = in_use[:, None] & (dims < HEAD_DIM)[None, :]
    src = layer * stride_cl + head * stride_ch + position[:, None] * stride_cs + dims[None, :]
    dst = layer * stride_pl + head * stride_ph + rows[:, None].to(tl.int64) * stride_pr + dims[None, :]
    tl.store(compact_k + dst, tl.load(k_cache + src, mask=mask), mask=mask)
    tl.store(compact_v + dst, tl.load(v_cache + src, mask=mask), mask=mask)


def gather_compact(k_cache: torch.Tensor, v_cache: torch.Tensor, compact_k: torch.Tensor,
                   compact_v: torch.Tensor, buffer: int, layers: torch.Tensor, row: int, sinks: int,
                   picks: torch.Tensor, window_start: int = 0, window_rows: int = 0) -> None:
    """sfi/state.gather_compact in one launch: positions [0, sinks), picks `[n, H_kv, K]` and
    [window_start, window_start + window_rows) of (layers[i], row) from the cache `[L, B, H_kv, S, D]` into
    rows [0, sinks + K + window_rows) of `compact_* [2, L, B, H_kv, R, D]` at `buffer`."""
    count, heads, picked = picks.shape
    dim = k_cache.shape[-1]
    if sinks + picked + window_rows > compact_k.shape[4]:
        raise ValueError(f"{sinks} sinks + {picked} picks + {window_rows} window rows do not fit a compact "
                         f"buffer of {compact_k.shape[4]} rows")
    if k_cache.stride() != v_cache.stride() or compact_k.stride() != compact_v.stride() \
            or k_cache.stride(-1) != 1 or compact_k.stride(-1) != 1:
        raise ValueError("K and V (cache and compact buffer) need the same strides and a contiguous "
                         "last dimension")
    if count == 0 or sinks + picked + window_rows == 0:
        return
    # Views [L, H_kv, S or R, D] of this row (and buffer): the offsets fold into the base pointers, so the
    # kernel's int32 arguments stay small whatever the batch.
    source_k, source_v = k_cache[:, row], v_cache[:, row]
    target_k, target_v = compact_k[buffer, :, row], compact_v[buffer, :, row]
    _gather_compact_kernel[(count, heads, triton.cdiv(sinks + picked + window_rows, BLOCK_ROWS))](
        source_k, source_v, target_k, target_v, layers, picks, sinks, picked, window_start, window_rows,
        *source_k.stride()[:3], *target_k.stride()[:3], *picks.stride(),
        HEAD_DIM=dim, BLOCK_D=triton.next_power_of_2(dim), BLOCK_ROWS=BLOCK_ROWS, num_warps=4,
    )
