"""Merging split-K partials: the last step of every split decode kernel (decode_attention.py, two_segment.py).

Each program of a (sequence, KV head) stores a partial max, sum of exponentials and unnormalised output per
query head for its split (`_finish_split`). The merge rescales all of a KV head's partials to a common max
and normalises them: by default inside the kernel, by the last split to finish (an atomic counter picks it),
in one round of loads for all its query heads (`_merge_group_at_once`) when they fit, head by head
otherwise (`_merge_splits`); or by a second kernel with one program per query head
(`_combine_splits_kernel`). decode_attention._launch_split_kernel picks the place with `merges_at_once`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sfibench.optimized import pdl


@triton.jit
def _finish_split(acc, running_max, running_sum, part_acc_ptr, part_max_ptr, part_sum_ptr, done_ptr, out_ptr,
                  stride_ob, stride_oh, stride_od, seq, kv_head, split, num_splits,
                  GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                  MERGE_IN_KERNEL: tl.constexpr, MERGE_G: tl.constexpr, MERGE_AT_ONCE: tl.constexpr):
    """Store this split's partials; with MERGE_IN_KERNEL the last split of the KV head to finish merges.

    An empty split (no keys) stores max -inf, sum 0, output 0: neutral in the merge. MERGE_AT_ONCE: all
    partials fit one tile of MERGE_G (GROUP rounded up to a power of two) x BLOCK_S x HEAD_DIM values.
    """
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    q_heads_total = tl.num_programs(1) * GROUP
    q_heads = kv_head * GROUP + offs_g
    is_real_head = offs_g < GROUP
    rows = (seq * q_heads_total + q_heads) * num_splits + split
    tl.store(part_max_ptr + rows, running_max, mask=is_real_head)
    tl.store(part_sum_ptr + rows, running_sum, mask=is_real_head)
    tl.store(part_acc_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=is_real_head[:, None])

    if MERGE_IN_KERNEL:
        # The last split of this (sequence, KV head) to finish merges all partials, so no second
        # kernel is launched. The barrier orders every thread's stores before the counter's release;
        # the acquire side reads the partials past L1 (.cg), which may hold lines of an earlier launch.
        tl.debug_barrier()
        counter = done_ptr + seq * tl.num_programs(1) + kv_head
        finished_before = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if finished_before == num_splits - 1:
            if MERGE_AT_ONCE:
                _merge_group_at_once(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_ob, stride_oh,
                                     stride_od, seq, kv_head * GROUP, q_heads_total, num_splits,
                                     GROUP, MERGE_G, HEAD_DIM, BLOCK_S)
            else:
                _merge_splits(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_ob, stride_oh, stride_od,
                              seq, kv_head * GROUP, q_heads_total, num_splits, GROUP, HEAD_DIM, BLOCK_S)
            tl.store(counter, 0)  # zero again for the next launch or graph replay


@triton.jit
def _merge_splits(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_ob, stride_oh, stride_od,
                  seq, first_head, q_heads_total, num_splits,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """Rescale every split's partial to a common max and normalise, one query head at a time, BLOCK_S
    splits per load: the second kernel's merge (GROUP = 1), and an in-kernel merge whose partials do
    not fit _merge_group_at_once's one load. Each head waits for its own loads (a runtime loop over
    splits sits between the heads), so in the kernel this costs GROUP trips to L2.
    """
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    for g in tl.static_range(GROUP):
        head = first_head + g
        first_row = (seq * q_heads_total + head) * num_splits
        merged_max = tl.full([], float("-inf"), tl.float32)
        merged_sum = tl.zeros([], tl.float32)
        merged = tl.zeros([HEAD_DIM], tl.float32)
        for s0 in range(0, num_splits, BLOCK_S):
            rows = first_row + s0 + offs_s
            in_range = s0 + offs_s < num_splits
            part_max = tl.load(part_max_ptr + rows, mask=in_range, other=float("-inf"), cache_modifier=".cg")
            part_sum = tl.load(part_sum_ptr + rows, mask=in_range, other=0.0, cache_modifier=".cg")
            part = tl.load(part_acc_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=in_range[:, None],
                           other=0.0, cache_modifier=".cg")
            new_max = tl.maximum(merged_max, tl.max(part_max, 0))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # no keys yet: avoid -inf - -inf
            old_weight, weights = tl.exp2(merged_max - shift), tl.exp2(part_max - shift)
            merged_sum = merged_sum * old_weight + tl.sum(part_sum * weights, 0)
            merged = merged * old_weight + tl.sum(part * weights[:, None], 0)
            merged_max = new_max
        out = merged / tl.where(merged_sum > 0, merged_sum, 1.0)  # no keys at all: zeros, not NaN
        tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d * stride_od, out.to(out_ptr.dtype.element_ty))


# The in-kernel merge loads every partial of a KV head's query heads at once when they fit in this many
# float32 values per program (64 registers a thread at 4 warps): [MERGE_G, BLOCK_S, HEAD_DIM].
MERGE_AT_ONCE_MAX_VALUES = 8192


def merges_at_once(group: int, num_splits: int, head_dim: int) -> bool:
    """Whether an in-kernel merge takes _merge_group_at_once (else _merge_splits, head by head), which
    is also where the splits merge by default (KernelConfig.merge_in_kernel None).

    Measured on an H200 (benchmarks/bench_attention.py --tune, bench_fast_path.py): merged at once in the
    kernel, dense decode at B = 1 (16 splits) took 47.6 us at 32K and 136.5 us at 128K against 48.9 and
    137.7 with the second kernel, and 2-4 us less at B = 5 (3 splits); SFI's fast-step attention
    (36 layers) 0.323 ms against 0.364 at B = 1 and 0.679 against 0.749 at B = 5. Merging head by head
    instead, the second kernel is the faster at 16 splits.
    """
    block_s = min(16, triton.next_power_of_2(num_splits))
    return num_splits <= block_s and triton.next_power_of_2(group) * block_s * head_dim <= MERGE_AT_ONCE_MAX_VALUES


@triton.jit
def _merge_group_at_once(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_ob, stride_oh, stride_od,
                         seq, first_head, q_heads_total, num_splits,
                         GROUP: tl.constexpr, MERGE_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """_merge_splits for all GROUP heads and all splits (num_splits <= BLOCK_S) in one round of loads.

    The merge runs after the slowest split, on the kernel's critical path: a loop over heads whose
    inner loop over splits is a runtime loop waits for each head's loads in turn (GROUP trips to L2),
    whereas one [MERGE_G, BLOCK_S, HEAD_DIM] load pays one.
    """
    offs_g = tl.arange(0, MERGE_G)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    is_real_head = offs_g < GROUP
    heads = first_head + offs_g
    rows = (seq * q_heads_total + heads)[:, None] * num_splits + offs_s[None, :]  # [G, S]
    present = is_real_head[:, None] & (offs_s < num_splits)[None, :]
    part_max = tl.load(part_max_ptr + rows, mask=present, other=float("-inf"), cache_modifier=".cg")
    part_sum = tl.load(part_sum_ptr + rows, mask=present, other=0.0, cache_modifier=".cg")
    part = tl.load(part_acc_ptr + rows[:, :, None] * HEAD_DIM + offs_d[None, None, :], mask=present[:, :, None],
                   other=0.0, cache_modifier=".cg")
    merged_max = tl.max(part_max, 1)
    shift = tl.where(merged_max == float("-inf"), 0.0, merged_max)  # no keys at all: avoid -inf - -inf
    weights = tl.exp2(part_max - shift[:, None])  # empty splits (max -inf) weigh 0
    merged_sum = tl.sum(part_sum * weights, 1)
    merged = tl.sum(part * weights[:, :, None], 1)
    out = merged / tl.where(merged_sum > 0, merged_sum, 1.0)[:, None]  # no keys at all: zeros, not NaN
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=is_real_head[:, None])


@triton.jit
def _combine_splits_kernel(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_ob, stride_oh, stride_od,
                           num_splits, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    """The merge as a second kernel, one program per (query head, sequence): for many splits."""
    pdl.wait_for_inputs(PDL)
    pdl.release_dependents(PDL)
    _merge_splits(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_ob, stride_oh, stride_od,
                  tl.program_id(1).to(tl.int64), tl.program_id(0), tl.num_programs(0), num_splits, 1, HEAD_DIM,
                  BLOCK_S)
