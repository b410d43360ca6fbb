"""SFI's fast-step attention in one kernel: a compact copy of the selected rows plus the cache's tail.

A fast step attends over sinks, the selected tokens and the recent window (SPEC section 2). Sinks and
selected tokens are scattered over the cache, so after each refresh they are copied once into a
contiguous compact buffer; the recent window is already contiguous in the cache and keeps growing
with every token, so it is read in place from `tail_start` to the current length. Reading both as
plain contiguous rows avoids a gather of positions at every step, and one softmax runs over their
union.

The index space of a (sequence, KV head) is the compact rows followed by the tail,
[0, count + tail_len), and it is cut into splits exactly as in decode_attention.py: the grid and the
split count come from static shapes, the counts and lengths are read on the device, and the same
tile, merge and launch code is used. So one CUDA graph serves every step however the lengths grow.
A split walks its part of that index space either as two loops (compact rows, then tail slots, each
through the dense tile code; the compact rows are then padded to whole tiles in the index space, and SFI
fills its compact segments to whole tiles with the window's first rows, so no tile is spent on padding) or,
when splits are short, as one loop whose tiles load from both segments at once (`one_loop`;
fast_read_launch picks it from a measurement).

The compact buffer is double-buffered (`P` = 2): a refresh writes the idle copy on a side stream while
steps keep reading the published one, and publishing is a device write to `row_buffer`. A negative
`row_buffer` makes a row dense (the whole cache is its tail), so slow steps and rows without a
selection yet run through the same kernel and graph. A dense pass can also write the raw logits of
the slots it reads (`evidence`), which the Selector needs, without a second pass over K.

decode_reference.two_segment_decode_reference is the float64 oracle tests/kernels/test_two_segment.py checks
this kernel against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sfibench.optimized import pdl
from sfibench.optimized.decode_attention import (
    KernelConfig,
    _accumulate,
    _attend_range,
    _check_inputs,
    _launch_split_kernel,
    _load_group_queries,
    _shared_memory,
    _softmax_weights,
    _split_range,
    default_config,
    default_num_splits,
    sm_count,
)
from sfibench.optimized.split_merge import _finish_split


@triton.jit
def _two_segment_split_kernel(
    q_ptr, out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, done_ptr,
    stride_qb, stride_qh, stride_qd, stride_ob, stride_oh, stride_od, num_splits, qk_scale_log2,
    compact_k_ptr, compact_v_ptr, count_ptr, k_ptr, v_ptr, tail_start_ptr, length_ptr, buffer_ptr,
    evidence_ptr, evidence_rows_ptr,
    stride_ckp, stride_ckb, stride_ckh, stride_ckn, stride_ckd,
    stride_cvp, stride_cvb, stride_cvh, stride_cvn, stride_cvd,
    stride_count_p, stride_count_b, stride_count_h,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_tail_p, stride_tail_b, stride_length, stride_buffer,
    stride_eb, stride_eh, stride_es, stride_evidence_rows,
    n_buffers, n_compact, n_slots, n_evidence,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr, MERGE_IN_KERNEL: tl.constexpr, MERGE_G: tl.constexpr, MERGE_AT_ONCE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, BLOCK_P: tl.constexpr, EVIDENCE: tl.constexpr,
    ONE_LOOP: tl.constexpr, PDL: tl.constexpr, INDEX_BEFORE_WAIT: tl.constexpr,
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)  # int64: batch/head offsets of a large cache exceed 2**31
    seq = tl.program_id(2).to(tl.int64)

    if not INDEX_BEFORE_WAIT:
        pdl.wait_for_inputs(PDL)
    # Everything below is read on the device, so a replayed graph follows the current step. Values
    # are clamped to the buffers' shapes: a bad index can give a wrong answer, never a stray read.
    # Every buffer's count and tail start is loaded alongside row_buffer rather than after it: one
    # round trip to memory before the first K tile instead of two.
    offs_p = tl.arange(0, BLOCK_P)
    is_buffer = offs_p < n_buffers
    counts = tl.load(count_ptr + offs_p * stride_count_p + seq * stride_count_b + kv_head * stride_count_h,
                     mask=is_buffer, other=0)
    tail_starts = tl.load(tail_start_ptr + offs_p * stride_tail_p + seq * stride_tail_b, mask=is_buffer, other=0)
    buffer = tl.load(buffer_ptr + seq * stride_buffer).to(tl.int64)
    is_dense = buffer < 0
    buffer = tl.minimum(tl.maximum(buffer, 0), n_buffers - 1)
    count = tl.sum(tl.where(offs_p == buffer, counts, 0), 0).to(tl.int32)
    count = tl.where(is_dense, 0, tl.minimum(tl.maximum(count, 0), n_compact))
    tail_start = tl.sum(tl.where(offs_p == buffer, tail_starts, 0), 0).to(tl.int32)
    tail_start = tl.where(is_dense, 0, tl.maximum(tail_start, 0))
    n_cache = tl.minimum(tl.load(length_ptr + seq * stride_length).to(tl.int32), n_slots)
    tail_len = tl.maximum(n_cache - tail_start, 0)
    # With a loop per segment, the index space pads the compact rows to whole tiles, so the tail's tiles
    # start on a tile boundary: the split holding the last compact rows then reads no more tiles than any
    # other, where unpadded it would read one more (a partial tile at each segment's end). One loop has tiles
    # that straddle both segments and needs no padding.
    if ONE_LOOP:
        compact_span = count
    else:
        compact_span = tl.cdiv(count, BLOCK_N) * BLOCK_N
    start, end = _split_range(compact_span + tail_len, split, num_splits, BLOCK_N)
    if INDEX_BEFORE_WAIT:
        pdl.wait_for_inputs(PDL)  # q and the newest cache slot are the kernel before's output

    q = _load_group_queries(q_ptr, seq, kv_head, stride_qb, stride_qh, stride_qd, GROUP, BLOCK_G, HEAD_DIM,
                            DOT_IN_FP32)
    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    if EVIDENCE:
        writes = tl.load(evidence_rows_ptr + seq * stride_evidence_rows) != 0
        evidence_end = tl.where(writes, n_evidence, 0)  # no slot is below 0: nothing written
    else:
        evidence_end = 0
    to_slot = tail_start - compact_span  # union index i >= compact_span is cache slot i + to_slot

    compact_k_head = compact_k_ptr + buffer * stride_ckp + seq * stride_ckb + kv_head * stride_ckh
    compact_v_head = compact_v_ptr + buffer * stride_cvp + seq * stride_cvb + kv_head * stride_cvh
    k_head = k_ptr + seq * stride_kb + kv_head * stride_kh
    v_head = v_ptr + seq * stride_vb + kv_head * stride_vh
    evidence_head = evidence_ptr + seq * stride_eb + kv_head * GROUP * stride_eh
    if ONE_LOOP:  # one loop over both segments
        acc, running_max, running_sum = _attend_both_segments(
            q, acc, running_max, running_sum, compact_k_head, compact_v_head, k_head, v_head, start, end,
            count, to_slot, stride_ckn, stride_ckd, stride_cvn, stride_cvd, stride_ks, stride_kd, stride_vs,
            stride_vd, qk_scale_log2, evidence_head, stride_eh, stride_es, evidence_end, GROUP=GROUP,
            BLOCK_G=BLOCK_G, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, WRITE_LOGITS=EVIDENCE,
            DOT_PRECISION=DOT_PRECISION, DOT_IN_FP32=DOT_IN_FP32)
    else:
        # A loop per segment over what is left, [first, end): compact rows are indices [first, min(end,
        # count)); index i >= compact_span is cache slot i - compact_span + tail_start (indices in between
        # are padding, read by no one). Iterating over slots runs the tail through the dense tile code
        # unchanged, and the slot is where its evidence goes.
        first = start
        acc, running_max, running_sum = _attend_range(
            q, acc, running_max, running_sum, compact_k_head, compact_v_head, q_ptr, first, tl.minimum(end, count),
            stride_ckn, stride_ckd, stride_cvn, stride_cvd, 0, qk_scale_log2, evidence_ptr, 0, 0, 0, GROUP=GROUP,
            BLOCK_G=BLOCK_G, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, SPARSE=False, WRITE_LOGITS=False,
            DOT_PRECISION=DOT_PRECISION, DOT_IN_FP32=DOT_IN_FP32)
        acc, running_max, running_sum = _attend_range(
            q, acc, running_max, running_sum, k_head, v_head, q_ptr, tl.maximum(first, compact_span) + to_slot,
            end + to_slot, stride_ks, stride_kd, stride_vs, stride_vd, 0, qk_scale_log2, evidence_head, stride_eh,
            stride_es, evidence_end, GROUP=GROUP, BLOCK_G=BLOCK_G, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
            SPARSE=False, WRITE_LOGITS=EVIDENCE, DOT_PRECISION=DOT_PRECISION, DOT_IN_FP32=DOT_IN_FP32)

    pdl.release_dependents(PDL)
    _finish_split(acc, running_max, running_sum, part_acc_ptr, part_max_ptr, part_sum_ptr, done_ptr, out_ptr,
                  stride_ob, stride_oh, stride_od, seq, kv_head, split, num_splits,
                  GROUP, BLOCK_G, HEAD_DIM, BLOCK_S, MERGE_IN_KERNEL, MERGE_G, MERGE_AT_ONCE)


@triton.jit
def _attend_both_segments(q, acc, running_max, running_sum, compact_k_head, compact_v_head, k_head, v_head,
                          start, end, count, to_slot, stride_ckn, stride_ckd, stride_cvn, stride_cvd,
                          stride_ks, stride_kd, stride_vs, stride_vd, qk_scale_log2,
                          evidence_head, stride_eh, stride_es, evidence_end,
                          GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                          WRITE_LOGITS: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """The online softmax over union indices [start, end) in one loop: index i < count is compact row i,
    any other is cache slot i + to_slot.

    A split that straddles the two segments would otherwise run two loops, each ending in a partial
    tile: at ~150 rows per split every loop is a serial round trip to memory, and the two loads of a
    tile (K, then V after the scores) are two more. Here each tile issues four masked loads at once (K
    and V from the compact buffer and from the cache; every row comes from exactly one of them, the
    other reads nothing and gives zeros), and the loop's tiles are pipelined as one stream.
    """
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    for block_start in range(start, end, BLOCK_N):
        idx = block_start + offs_n
        in_split = idx < end
        from_compact = (in_split & (idx < count))[:, None]
        from_cache = in_split & (idx >= count)
        slots = idx + to_slot
        k = tl.load(compact_k_head + idx[:, None] * stride_ckn + offs_d[None, :] * stride_ckd, mask=from_compact,
                    other=0.0) + \
            tl.load(k_head + slots[:, None] * stride_ks + offs_d[None, :] * stride_kd, mask=from_cache[:, None],
                    other=0.0)
        v = tl.load(compact_v_head + idx[:, None] * stride_cvn + offs_d[None, :] * stride_cvd, mask=from_compact,
                    other=0.0) + \
            tl.load(v_head + slots[:, None] * stride_vs + offs_d[None, :] * stride_vd, mask=from_cache[:, None],
                    other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        if WRITE_LOGITS:  # the evidence of cache slots (a dense row's every slot), natural-log domain
            written = (offs_g < GROUP)[:, None] & (from_cache & (slots < evidence_end))[None, :]
            tl.store(evidence_head + offs_g[:, None] * stride_eh + slots[None, :] * stride_es,
                     scores * 0.6931471805599453, mask=written)
        scores = tl.where(in_split[None, :], scores, float("-inf"))
        probs, rescale, running_max, running_sum = _softmax_weights(scores, running_max, running_sum)
        acc = _accumulate(acc, probs, rescale, v, DOT_PRECISION, DOT_IN_FP32)
    return acc, running_max, running_sum


# A split reading at most this many rows runs one loop over both segments; a longer one runs a loop per
# segment. Measured on an H200 (benchmarks/bench_fast_path.py, Qwen3-4B shape, 2,308 rows, 36 layers graphed):
# at B = 1 (16 splits, ~144 rows each) one loop takes 0.367 ms against 0.481 for two, because each loop and
# each partial tile is a serial round trip to memory; at B = 5 (3 splits, ~770 rows each) two loops win, 0.765
# ms against 0.799, since there the tiles are many and one loop's four masked loads per tile cost more than
# they save. The same bound marks the launches that take programmatic dependent launch by default (pdl.py says
# why).
ONE_LOOP_MAX_ROWS_PER_SPLIT = 256


def dense_read_launch(batch: int, kv_heads: int, max_seq: int, device: torch.device) -> dict:
    """two_segment_decode's split count and loop form for steps where some row reads its whole history.

    They split as if the batch were one sequence: the dense row reads up to `max_seq` rows while the others
    read ~2K, and with the batch-sized split count (one program per SM over all rows) that one row would
    get only 1/B of the GPU. (Running the split that straddles both segments as one loop there measured
    slower at short contexts than the loop per segment.)"""
    return {"num_splits": default_num_splits(1, kv_heads, max_seq, sm_count(device))}


# Long splits (a loop per segment: B > 1 at these lengths) of some shapes launch other than one program per SM
# with default_config's four stages, keyed by (SMs, sequences x KV heads: the grid's other two dimensions):
# splits, stages. Measured on an H200 (132 SMs), the two-segment attention alone over all layers graphed
# (benchmarks/bench_fast_path.py, 2,052 compact rows + 256 tail): qwen3-0.6b B = 7 (56 pairs) 0.683 ms at 2
# splits and 4 stages, 0.636 at 4 splits and 3 stages; then in whole graphed steps
# (reports/throughput-qwen3-0.6b-h200 at e2dd341 against 28a8103's) SFI's fast step 1.596 -> 1.526 ms at 8K,
# SnapKV's 1.569 -> 1.508. qwen3-4b B = 5 (40 pairs) was fastest at its default 3 splits (0.673 ms), and 3
# stages took it to 0.649 in the kernel alone; in whole graphed steps at 32K (one run) SFI's fast step 3.279
# -> 3.265 ms, StreamingLLM's unchanged (3.295 -> 3.294).
LONG_SPLIT_SHAPES = {(132, 56): (4, 3), (132, 40): (3, 3)}


def fast_read_launch(batch: int, kv_heads: int, rows: int, device: torch.device) -> dict:
    """two_segment_decode's split count and loop form for steps reading about `rows` rows per
    (sequence, KV head): one program per SM (default_num_splits); when the splits are short, one loop and
    PDL (pdl.py's `short_attention` kind); when long, splits and stages from LONG_SPLIT_SHAPES where it has
    the shape."""
    splits = default_num_splits(batch, kv_heads, rows, sm_count(device))
    short = rows <= splits * ONE_LOOP_MAX_ROWS_PER_SPLIT
    launch = {"num_splits": splits, "one_loop": short, "short_splits": short}
    shape = (sm_count(device), batch * kv_heads)
    if not short and shape in LONG_SPLIT_SHAPES:
        launch["num_splits"], launch["num_stages"] = LONG_SPLIT_SHAPES[shape]
    return launch


def _check_index(name: str, tensor: torch.Tensor, shape: tuple) -> None:
    if tensor.shape != shape:
        raise ValueError(f"{name} must be {list(shape)}, got {list(tensor.shape)}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise ValueError(f"{name} must be an integer tensor, got {tensor.dtype}")


def two_segment_decode(q: torch.Tensor, compact_k: torch.Tensor, compact_v: torch.Tensor,
                       compact_counts: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tail_start: torch.Tensor,
                       lengths: torch.Tensor, row_buffer: torch.Tensor, evidence: torch.Tensor | None = None,
                       evidence_rows: torch.Tensor | None = None, num_splits: int | None = None, *,
                       config: KernelConfig | None = None, out: torch.Tensor | None = None,
                       one_loop: bool = False, num_stages: int | None = None,
                       index_before_wait: bool = False, short_splits: bool = False) -> torch.Tensor:
    """q `[B, H_q, D]` over compact rows plus a cache tail, one softmax per query head; -> `[B, H_q, D]`.

    Row b reads buffer p = row_buffer[b] and attends over compact rows [0, compact_counts[p, b, h]) of
    compact_k/v `[P, B, H_kv, N, D]` and cache slots [tail_start[p, b], lengths[b]) of k/v
    `[B, H_kv, S, D]`; a negative row_buffer[b] means cache slots [0, lengths[b]) only. The caller keeps
    the two segments disjoint. Index tensors (any integer dtype, any strides) live on q's device and
    are read by the kernel, never synchronised.

    evidence float32 `[B, H_q, S_e]` with evidence_rows `[B]`: rows with evidence_rows[b] != 0 get
    q.k/sqrt(D) of every tail slot < S_e written at evidence[b, head, slot]; nothing else is written.
    `one_loop`: every split runs one loop over both segments; else a loop per segment. Same result either way. `num_stages`
    replaces default_config's (without `config`).
    `index_before_wait`, `short_splits`: see decode_attention._launch_split_kernel.
    """
    batch, q_heads, head_dim = q.shape
    kv_heads, n_slots = k.shape[1], k.shape[2]
    if compact_k.dim() != 5 or compact_k.shape != compact_v.shape or compact_k.shape[1:3] != k.shape[:2] \
            or compact_k.shape[4] != head_dim:
        raise ValueError(f"compact_k and compact_v must be [P, B, H_kv, N, D] of one shape with [B, H_kv, D] = "
                         f"{[batch, kv_heads, head_dim]}, got {tuple(compact_k.shape)} and {tuple(compact_v.shape)}")
    if not compact_k.dtype == compact_v.dtype == q.dtype:
        raise ValueError(f"compact_k/v must have q's dtype {q.dtype}, got {compact_k.dtype}, {compact_v.dtype}")
    n_buffers, n_compact = compact_k.shape[0], compact_k.shape[3]
    _check_index("compact_counts", compact_counts, (n_buffers, batch, kv_heads))
    _check_index("tail_start", tail_start, (n_buffers, batch))
    _check_index("lengths", lengths, (batch,))
    _check_index("row_buffer", row_buffer, (batch,))
    write_evidence = evidence is not None
    if write_evidence != (evidence_rows is not None):
        raise ValueError("pass evidence and evidence_rows together (or neither)")
    if write_evidence:
        if evidence.dtype != torch.float32 or evidence.dim() != 3 or evidence.shape[:2] != (batch, q_heads):
            raise ValueError(f"evidence must be float32 [B, H_q, S_e] with [B, H_q] = {[batch, q_heads]}, "
                             f"got {evidence.dtype} {tuple(evidence.shape)}")
        if evidence_rows.shape != (batch,):
            raise ValueError(f"evidence_rows must be [B] = [{batch}], got {tuple(evidence_rows.shape)}")
        if evidence_rows.dtype == torch.bool:
            evidence_rows = evidence_rows.view(torch.uint8)  # same bytes, a type every Triton version loads
        evidence_strides, n_evidence = (*evidence.stride(), evidence_rows.stride(0)), evidence.shape[2]
    else:  # the pointers still need a tensor: q, never touched with EVIDENCE off
        evidence, evidence_rows, evidence_strides, n_evidence = q, q, (0, 0, 0, 0), 0
    _check_inputs(q, k, v, num_splits, {
        "compact_k/v": compact_k, "compact_counts": compact_counts, "tail_start": tail_start, "lengths": lengths,
        "row_buffer": row_buffer, "evidence": evidence, "evidence_rows": evidence_rows})
    if num_stages is not None and config is None:
        base = default_config(head_dim, q.dtype, _shared_memory(q.device))
        config = KernelConfig(base.block_n, base.num_warps, num_stages, base.merge_in_kernel)
    if one_loop and config is None and q.dtype == torch.float32:
        # One loop streams four tiles per stage (K and V from both segments): in float32 the default four
        # stages need 237 KB of shared memory, more than an H200 block has (227 KB); three fit.
        base = default_config(head_dim, q.dtype, _shared_memory(q.device))
        config = KernelConfig(base.block_n, base.num_warps, min(base.num_stages, 3), base.merge_in_kernel)
    return _launch_split_kernel(
        _two_segment_split_kernel, q, out, kv_heads, n_compact + n_slots, num_splits, config,
        compact_k, compact_v, compact_counts, k, v, tail_start, lengths, row_buffer, evidence, evidence_rows,
        *compact_k.stride(), *compact_v.stride(), *compact_counts.stride(), *k.stride(), *v.stride(),
        *tail_start.stride(), lengths.stride(0), row_buffer.stride(0), *evidence_strides,
        n_buffers, n_compact, n_slots, n_evidence,
        BLOCK_P=max(2, triton.next_power_of_2(n_buffers)), EVIDENCE=write_evidence, ONE_LOOP=one_loop,
        index_before_wait=index_before_wait, short_splits=short_splits)
