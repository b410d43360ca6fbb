"""Split-K ("flash-decoding") attention for one query token per sequence, dense or over chosen slots.

Decode attention reads every cached key and value once and does two small matrix products with them,
so it is bound by memory bandwidth, and at B x H_kv programs a long context leaves most SMs idle. So
the keys of each (sequence, KV head) are cut into `num_splits` splits, one program each. A program
streams its split's K/V tiles through an online softmax in float32 and writes a partial max, sum of
exponentials and unnormalised output per query head. The merge (rescale all partials to a common
max and normalise) is done either by the last program of a (sequence, KV head) to finish, which an
atomic counter picks, in one round of loads for all its query heads, saving a second launch; or, when
the partials are too many for one load, by a second kernel with one program per query head.

GQA: the G query heads of a KV head are consecutive, and one program serves all of them, so K/V are
read once per KV head. The G rows are padded to 16 and multiplied with `tl.dot`: the tensor cores
have compute to spare at decode, whereas broadcasting `[G, BLOCK_N, D]` products for `tl.sum` needs
G*BLOCK_N*D/threads registers per thread and spills at D = 128.

CUDA-graph safety: the grid and the split count depend only on static shapes (B, H_kv, S or N). The
number of keys is read inside the kernel from `lengths`/`counts`, and each split covers
`ceil(ceil(n / num_splits) / BLOCK_N)` blocks of it, so all splits share the work at any length and
splits past the end write neutral partials without touching K/V: the unused tail of a static cache
costs nothing. Launch each shape once before capture (the first call compiles).

The merge lives in split_merge.py. two_segment.py builds SFI's fast-step kernel from the same tile, split,
merge and launch pieces.
decode_reference.py holds the float64 torch references that tests/kernels/test_kernels.py checks these
kernels against; benchmarks/bench_attention.py measures their bandwidth against PyTorch SDPA.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from sfibench.optimized import pdl
from sfibench.optimized.split_merge import _combine_splits_kernel, _finish_split, merges_at_once


@dataclass(frozen=True)
class KernelConfig:
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int  # K/V tiles in flight (software pipelining of the loads)
    merge_in_kernel: bool | None = None  # None: in the kernel when merges_at_once


def tile_rows(head_dim: int, itemsize: int) -> int:
    """Keys per tile (BLOCK_N): 16 KB of K per tile, 16 to 128 rows."""
    return max(16, min(128, 16384 // (head_dim * itemsize)))


def default_config(head_dim: int, dtype: torch.dtype, shared_memory: int = 227 * 1024) -> KernelConfig:
    """Static choice per shape: no runtime autotuning, since a CUDA-graph capture must not benchmark.

    A stage holds one K and one V tile, ~32 KB of them (BLOCK_N = 64 at D = 128 in bf16). With one
    program per SM (see default_num_splits) four stages keep three tile pairs in flight while one is
    consumed, ~130 KB of shared memory: measured on an H200 (benchmarks/bench_attention.py --tune), four
    stages at one program per SM came within 1.1% of the best (splits, tile, stages) in the grid
    at B = 1, 5, 8 and 8K-128K. GPUs with less shared memory per block (`shared_memory`, bytes) get two.
    Eight warps only at D = 256, where the [16, D] accumulator doubles.
    """
    block_n = tile_rows(head_dim, dtype.itemsize)
    stage_bytes = 2 * block_n * head_dim * dtype.itemsize
    stages = 4 if shared_memory >= 4 * stage_bytes + 16 * 1024 else 2
    return KernelConfig(block_n=block_n, num_warps=8 if head_dim >= 256 else 4, num_stages=stages)


FILLED_SMS = 0.8  # fewest programs per wave, as a share of the SMs, that keep a decode read at the copy bandwidth


def default_num_splits(batch: int, kv_heads: int, max_len: int, sm_count: int = 132) -> int:
    """Splits per (sequence, KV head) so the grid holds about one program per SM, in one wave.

    Decode attention is a stream of loads: what matters is that every SM has one deeply pipelined
    program (default_config) and that no SM gets a second round while others idle. Measured on an
    H200 (Qwen3 attention shapes, bf16, benchmarks/bench_attention.py --tune): one program per SM beat
    two per SM by 1-6% at 8K-128K and B = 1, 5, 8; a grid just past a whole
    wave (e.g. 5 splits x 40 heads = 200 programs) is the worst case. Splits never go below 128 keys at
    full length (two tiles), so short caches are not cut into slivers.

    A fast step passes the rows it reads (~2.3K) as `max_len`: measured on an H200
    (benchmarks/bench_fast_path.py, 36 layers graphed), one program per
    SM was best there too (B = 1: 16 splits 0.47 ms, 4 splits 0.58, 1 split 1.36; B = 5: 3 splits).

    One program per SM can still leave SMs idle (B = 9 on 8 KV heads: 72 programs at one split, 144 at two, a
    second wave of 12), and one SM streams only about 1/105 of the copy bandwidth. So where the grid's waves
    average fewer than FILLED_SMS of the SMs, the count rises to the smallest that fills them (B = 9: 3
    splits; B = 6: 5). The kernel alone at 128K (reports/attention-splits): B = 9 on an H200 read at 68% of
    the copy bandwidth with 1 split, 97% with 3; B = 6 on an H100 at 67% with 1, 99% with 5.
    """
    pairs, most = batch * kv_heads, max(1, max_len // 128)
    first = max(1, min(sm_count // pairs, most))
    for splits in range(first, most + 1):
        programs = pairs * splits
        if programs / -(-programs // sm_count) >= FILLED_SMS * sm_count:  # programs per wave
            return splits
    return first


@functools.cache
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # interpreter runs on the CPU: any value works, use the H100/H200 one
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _shared_memory(device: torch.device) -> int:
    if device.type != "cuda":
        return 227 * 1024  # the interpreter ignores it; the H100/H200 value
    properties = torch.cuda.get_device_properties(device)
    return getattr(properties, "shared_memory_per_block_optin", 48 * 1024)


@triton.jit
def _attend_tile(q, acc, running_max, running_sum, k_head, v_head, pos_head, idx, end, offs_g, offs_d,
                 stride_ks, stride_kd, stride_vs, stride_vd, stride_pn, qk_scale_log2,
                 logits_head, stride_lg, stride_ls, logits_end,
                 GROUP: tl.constexpr, SPARSE: tl.constexpr, MASKED: tl.constexpr, WRITE_LOGITS: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """One online-softmax update with the keys/values at `idx` (slots, or indices into the positions).

    WRITE_LOGITS also stores each query head's logit q.k/sqrt(D) at `logits_head + g * stride_lg + slot *
    stride_ls` for slots below `logits_end`: the evidence a slow step needs, taken from the scores the
    softmax computes anyway instead of a second pass over K.
    """
    in_split = idx < end
    if SPARSE:
        if MASKED:
            slots = tl.load(pos_head + idx * stride_pn, mask=in_split, other=0)
        else:
            slots = tl.load(pos_head + idx * stride_pn)
    else:
        slots = idx
    k_ptrs = k_head + slots[:, None] * stride_ks + offs_d[None, :] * stride_kd
    v_ptrs = v_head + slots[:, None] * stride_vs + offs_d[None, :] * stride_vd
    if MASKED:  # masked rows are never read: NaN or garbage past the end cannot leak in
        k = tl.load(k_ptrs, mask=in_split[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    if DOT_IN_FP32:
        k = k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
    if WRITE_LOGITS:
        written = (offs_g < GROUP)[:, None] & (in_split & (slots < logits_end))[None, :]
        tl.store(logits_head + offs_g[:, None] * stride_lg + slots[None, :] * stride_ls,
                 scores * 0.6931471805599453, mask=written)  # log2 domain -> natural log (x ln 2)
    if MASKED:
        scores = tl.where(in_split[None, :], scores, float("-inf"))
    probs, rescale, new_max, running_sum = _softmax_weights(scores, running_max, running_sum)
    if MASKED:
        v = tl.load(v_ptrs, mask=in_split[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = _accumulate(acc, probs, rescale, v, DOT_PRECISION, DOT_IN_FP32)
    return acc, new_max, running_sum


@triton.jit
def _softmax_weights(scores, running_max, running_sum):
    """Online softmax over one tile of log2-domain scores `[G, N]`: the tile's unnormalised
    probabilities, the factor that rescales what was accumulated so far, and the new max and sum."""
    new_max = tl.maximum(running_max, tl.max(scores, 1))
    rescale = tl.exp2(running_max - new_max)
    probs = tl.exp2(scores - new_max[:, None])
    return probs, rescale, new_max, running_sum * rescale + tl.sum(probs, 1)


@triton.jit
def _accumulate(acc, probs, rescale, v, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """acc * rescale + probs @ v, with probs rounded to v's dtype as a 16-bit MMA would."""
    probs = probs.to(v.dtype)  # the rounding a 16-bit MMA applies, kept when DOT_IN_FP32
    if DOT_IN_FP32:
        probs, v = probs.to(tl.float32), v.to(tl.float32)
    return acc * rescale[:, None] + tl.dot(probs, v, input_precision=DOT_PRECISION)


@triton.jit
def _attend_range(q, acc, running_max, running_sum, k_head, v_head, pos_head, start, end,
                  stride_ks, stride_kd, stride_vs, stride_vd, stride_pn, qk_scale_log2,
                  logits_head, stride_lg, stride_ls, logits_end,
                  GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPARSE: tl.constexpr, WRITE_LOGITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  DOT_IN_FP32: tl.constexpr):
    """The online softmax over keys [start, end) (empty when start >= end).

    Whole tiles run without masks (plain vector loads, nothing to select); at most one partial tile at
    the end is masked.
    """
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    for block_start in range(start, full_end, BLOCK_N):
        acc, running_max, running_sum = _attend_tile(
            q, acc, running_max, running_sum, k_head, v_head, pos_head, block_start + offs_n, end, offs_g, offs_d,
            stride_ks, stride_kd, stride_vs, stride_vd, stride_pn, qk_scale_log2,
            logits_head, stride_lg, stride_ls, logits_end, GROUP=GROUP, SPARSE=SPARSE, MASKED=False,
            WRITE_LOGITS=WRITE_LOGITS, DOT_PRECISION=DOT_PRECISION, DOT_IN_FP32=DOT_IN_FP32)
    if full_end < end:
        acc, running_max, running_sum = _attend_tile(
            q, acc, running_max, running_sum, k_head, v_head, pos_head, full_end + offs_n, end, offs_g, offs_d,
            stride_ks, stride_kd, stride_vs, stride_vd, stride_pn, qk_scale_log2,
            logits_head, stride_lg, stride_ls, logits_end, GROUP=GROUP, SPARSE=SPARSE, MASKED=True,
            WRITE_LOGITS=WRITE_LOGITS, DOT_PRECISION=DOT_PRECISION, DOT_IN_FP32=DOT_IN_FP32)
    return acc, running_max, running_sum


@triton.jit
def _load_group_queries(q_ptr, seq, kv_head, stride_qb, stride_qh, stride_qd,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                        DOT_IN_FP32: tl.constexpr):
    """The G query rows of one KV head as a [BLOCK_G, D] tile, padding rows zero."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    q_heads = kv_head * GROUP + offs_g
    q = tl.load(q_ptr + seq * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=(offs_g < GROUP)[:, None], other=0.0)
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    return q


@triton.jit
def _split_range(n_keys, split, num_splits, BLOCK_N: tl.constexpr):
    """Keys [start, end) of this split: every split gets the same whole number of tiles at any length."""
    split_len = tl.cdiv(tl.cdiv(n_keys, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    return start, tl.minimum(start + split_len, n_keys)


@triton.jit
def _decode_split_kernel(
    q_ptr, out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, done_ptr,
    stride_qb, stride_qh, stride_qd, stride_ob, stride_oh, stride_od, num_splits, qk_scale_log2,
    k_ptr, v_ptr, bound_ptr, pos_ptr,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_bound_b, stride_bound_h, stride_pb, stride_ph, stride_pn, n_slots,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr, MERGE_IN_KERNEL: tl.constexpr, MERGE_G: tl.constexpr, MERGE_AT_ONCE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, SPARSE: tl.constexpr, PDL: tl.constexpr,
    INDEX_BEFORE_WAIT: tl.constexpr,
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)  # int64: batch/head offsets of a large cache exceed 2**31
    seq = tl.program_id(2).to(tl.int64)

    if not INDEX_BEFORE_WAIT:
        pdl.wait_for_inputs(PDL)
    # Read on the device so a replayed CUDA graph sees the current length; clamped so a bad length
    # can never read outside the cache.
    n_keys = tl.load(bound_ptr + seq * stride_bound_b + kv_head * stride_bound_h).to(tl.int32)
    start, end = _split_range(tl.minimum(n_keys, n_slots), split, num_splits, BLOCK_N)
    if INDEX_BEFORE_WAIT:
        pdl.wait_for_inputs(PDL)  # q and the newest cache slot are the kernel before's output

    q = _load_group_queries(q_ptr, seq, kv_head, stride_qb, stride_qh, stride_qd, GROUP, BLOCK_G, HEAD_DIM,
                            DOT_IN_FP32)
    # Scores live in the log2 domain (scale folded with log2(e)) so the softmax uses exp2.
    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    acc, running_max, running_sum = _attend_range(
        q, acc, running_max, running_sum, k_ptr + seq * stride_kb + kv_head * stride_kh,
        v_ptr + seq * stride_vb + kv_head * stride_vh, pos_ptr + seq * stride_pb + kv_head * stride_ph, start, end,
        stride_ks, stride_kd, stride_vs, stride_vd, stride_pn, qk_scale_log2, out_ptr, 0, 0, 0,
        GROUP=GROUP, BLOCK_G=BLOCK_G, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, SPARSE=SPARSE, WRITE_LOGITS=False,
        DOT_PRECISION=DOT_PRECISION, DOT_IN_FP32=DOT_IN_FP32)
    pdl.release_dependents(PDL)
    _finish_split(acc, running_max, running_sum, part_acc_ptr, part_max_ptr, part_sum_ptr, done_ptr, out_ptr,
                  stride_ob, stride_oh, stride_od, seq, kv_head, split, num_splits,
                  GROUP, BLOCK_G, HEAD_DIM, BLOCK_S, MERGE_IN_KERNEL, MERGE_G, MERGE_AT_ONCE)


# The interpreter's tl.dot multiplies the bit patterns of bfloat16 operands (triton#11584), so under
# TRITON_INTERPRET the kernel upcasts them first: bf16 x bf16 products are exact in float32, so only
# the summation order differs from the GPU's bf16 MMA with float32 accumulation.
_INTERPRETED = isinstance(_decode_split_kernel, InterpretedFunction)


@functools.cache
def _done_counters(device: torch.device, size: int) -> torch.Tensor:
    """Per-(sequence, KV head) finish counters; every launch leaves them at zero again.

    One buffer per device and size, allocated on the first (un-captured) launch and reused by every
    later launch and graph replay. Launches that share it must not overlap: they run in stream order.
    """
    return torch.zeros(size, dtype=torch.int32, device=device)


def _check_inputs(q, k, v, num_splits, device_tensors):
    """The checks every launcher shares; `device_tensors` maps names to the index tensors the kernel reads."""
    batch, q_heads, head_dim = q.shape
    if k.shape != v.shape or k.dim() != 4 or k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"q {tuple(q.shape)} needs k and v [B, H_kv, S, D] of one shape, got "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, tensor in device_tensors.items():
        if tensor.device != q.device:
            raise ValueError(f"{name} must live on {q.device} (the kernel reads them), got {tensor.device}")
    if q_heads % k.shape[1]:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of KV heads ({k.shape[1]})")
    if head_dim not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {head_dim}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1 (or None for the default), got {num_splits}")


def _launch_split_kernel(kernel, q, out, kv_heads, n_slots, num_splits, config, *kernel_args,
                        index_before_wait: bool = False, short_splits: bool = False, **constexprs):
    """Launch `kernel` on the (split, KV head, sequence) grid and merge its partials into `out`.

    Every split kernel takes the same leading arguments (queries, output, partials, counters, their
    strides, split count, scale) and compile-time shape options; `kernel_args` and `constexprs` are the
    rest. The split count comes from the static shapes (`n_slots` keys at most per row), never from lengths.
    With PDL (pdl.py) and `index_before_wait`, the kernel reads its index tensors (lengths, counts, row
    buffers) before waiting for the kernel before it: a caller passes it only where that kernel does not
    write them (at decode: the kernel that appends the step's k/v). `short_splits`: the caller expects each
    split to read only a few hundred rows (a fast step), which decides whether PDL applies (pdl.WITH_PDL).
    """
    batch, q_heads, head_dim = q.shape
    config = config or default_config(head_dim, q.dtype, _shared_memory(q.device))
    num_splits = num_splits if num_splits else default_num_splits(batch, kv_heads, n_slots, sm_count(q.device))
    if out is None:
        out = torch.empty(batch, q_heads, head_dim, device=q.device, dtype=q.dtype)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    part_acc = torch.empty(batch, q_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
    part_max = torch.empty(batch, q_heads, num_splits, device=q.device, dtype=torch.float32)
    part_sum = torch.empty_like(part_max)

    done = _done_counters(q.device, batch * kv_heads)
    block_s = min(16, triton.next_power_of_2(num_splits))
    group = q_heads // kv_heads
    merge_at_once = merges_at_once(group, num_splits, head_dim)
    merge_in_kernel = merge_at_once if config.merge_in_kernel is None else config.merge_in_kernel
    launch = pdl.launch_options(q.device, "short_attention" if short_splits else "attention")
    kernel[(num_splits, kv_heads, batch)](
        q, out, part_acc, part_max, part_sum, done, *q.stride(), *out.stride(), num_splits,
        math.log2(math.e) / math.sqrt(head_dim), *kernel_args,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_N=config.block_n, BLOCK_S=block_s, MERGE_IN_KERNEL=merge_in_kernel,
        MERGE_G=triton.next_power_of_2(group), MERGE_AT_ONCE=merge_at_once,
        # Only float32 operands heed the precision: keep them exact instead of rounding to tf32.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or _INTERPRETED else "tf32",
        DOT_IN_FP32=_INTERPRETED and q.dtype == torch.bfloat16,
        INDEX_BEFORE_WAIT=index_before_wait, num_warps=config.num_warps, num_stages=config.num_stages,
        **launch, **constexprs,
    )
    if not merge_in_kernel:
        _combine_splits_kernel[(q_heads, batch)](part_acc, part_max, part_sum, out, *out.stride(), num_splits,
                                                 HEAD_DIM=head_dim, BLOCK_S=block_s, num_warps=4, **launch)
    return out


def _decode(q, k, v, bounds, bound_strides, positions, n_slots, num_splits, config, out, index_before_wait=False):
    """Shared launcher of dense and sparse decode; `positions` None means dense (slot i is the i-th key)."""
    _check_inputs(q, k, v, num_splits, {"lengths/counts": bounds})
    return _launch_split_kernel(
        _decode_split_kernel, q, out, k.shape[1], n_slots, num_splits, config,
        k, v, bounds, bounds if positions is None else positions, *k.stride(), *v.stride(), *bound_strides,
        *((0, 0, 0) if positions is None else positions.stride()), n_slots, SPARSE=positions is not None,
        index_before_wait=index_before_wait)


def dense_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                 num_splits: int | None = None, *, config: KernelConfig | None = None,
                 out: torch.Tensor | None = None, index_before_wait: bool = False) -> torch.Tensor:
    """q `[B, H_q, D]` over slots [0, lengths[b]) of k/v `[B, H_kv, S, D]` (any strides); -> `[B, H_q, D]`.

    `lengths` is a `[B]` integer tensor on q's device, read by the kernel (never synchronised);
    `index_before_wait`: see _launch_split_kernel.
    """
    if lengths.shape != (q.shape[0],):
        raise ValueError(f"lengths must be [B] = [{q.shape[0]}], got {tuple(lengths.shape)}")
    return _decode(q, k, v, lengths, (lengths.stride(0), 0), None, k.shape[2], num_splits, config, out,
                   index_before_wait)


def sparse_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  counts: torch.Tensor, num_splits: int | None = None, *, config: KernelConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """q `[B, H_q, D]` over slots `positions[b, h, :counts[b, h]]` of each KV head; -> `[B, H_q, D]`.

    positions `[B, H_kv, N]` (int32/int64; entries past the count are ignored), counts `[B, H_kv]`.
    K/V rows are gathered inside the kernel, never copied.
    """
    if counts.shape != k.shape[:2] or positions.shape[:2] != k.shape[:2] or positions.dim() != 3:
        raise ValueError(f"positions must be [B, H_kv, N] and counts [B, H_kv] with [B, H_kv] = "
                         f"{list(k.shape[:2])}, got {tuple(positions.shape)} and {tuple(counts.shape)}")
    return _decode(q, k, v, counts, counts.stride(), positions, positions.shape[2], num_splits, config, out)
