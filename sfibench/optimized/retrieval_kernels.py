"""Kernels of per-step retrieval: score pages or tokens for one query, and list the rows a step reads.

Three launches serve the retrieval methods' optimized paths (the ranking between them is the radix
top-k of top_k_kernels.py, and the attention is decode_attention.sparse_decode, which reads the listed
rows in place in the cache):

- `page_scores`: per (sequence, KV head, page) the bound `sum_g sum_i max(q_gi M_i, q_gi m_i)` over the
  pages before the current one (-inf elsewhere), from the element-wise max M and min m of each page's
  keys. The same launch folds the step's new key into its page's M and m (the current page is never
  scored, so the order of the two does not matter).
- `token_scores`: per (sequence, KV head, slot) the logits q.k of the G query heads summed, over the slots
  before the current one (-inf elsewhere).
- `expand_positions`: chosen pages (sorted ascending, the real ones first) -> the slots they hold, then
  the current page's slots, and how many there are.

Each has a plain torch reference beside it (`*_reference`), which tests/kernels/test_retrieval_kernels.py
checks it against under TRITON_INTERPRET=1. Shapes: q `[B, H_q, D]`, one layer's keys `[B, H_kv, S, D]`,
lengths `[B]` (this step's key already written at slot lengths - 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Page scoring's launch: 64 pages a program with 8 warps was the fastest of 32-256 pages x 2-8 warps on an H100
# at 32K and 128K, B=1 and B=6 (reports/quest-page-scores-h100).
BLOCK_PAGES = 64  # pages scored by one program
PAGE_WARPS = 8
BLOCK_SLOTS = 128  # slots scored by one program


def page_scores_reference(q, highest, lowest, keys, lengths, page: int) -> torch.Tensor:
    """Fold each sequence's newest key into its page's bounds (in place) and score the earlier pages."""
    batch, q_heads, dim = q.shape
    kv_heads, pages = highest.shape[1], highest.shape[2]
    position = lengths - 1
    rows = torch.arange(batch, device=q.device)
    new_key = keys[rows, :, position]  # [B, H_kv, D]
    current = position // page
    fresh = (position % page == 0)[:, None, None]
    old_high, old_low = highest[rows, :, current], lowest[rows, :, current]
    highest[rows, :, current] = torch.where(fresh, new_key, torch.maximum(old_high, new_key))
    lowest[rows, :, current] = torch.where(fresh, new_key, torch.minimum(old_low, new_key))
    # max(q_i M_i, q_i m_i) is q_i M_i where q_i >= 0 and q_i m_i elsewhere (M >= m), so the bound summed over
    # the group is two products per KV head: sum_g q_g+ with M, sum_g q_g- with m (no [G, P, D] temporary)
    grouped = q.float().view(batch, kv_heads, q_heads // kv_heads, dim)
    positive, negative = grouped.clamp(min=0).sum(dim=2), grouped.clamp(max=0).sum(dim=2)  # [B, H_kv, D]
    scores = torch.einsum("bhd,bhpd->bhp", positive, highest.float()) \
        + torch.einsum("bhd,bhpd->bhp", negative, lowest.float())  # empty pages (+-inf bounds) may give nan: masked below
    before = torch.arange(pages, device=q.device)[None, :] < current[:, None]
    return scores.masked_fill(~before[:, None], float("-inf"))


@triton.jit
def _page_scores_kernel(q_ptr, high_ptr, low_ptr, k_ptr, length_ptr, out_ptr,
                        stride_qb, stride_qh, stride_mb, stride_mh, stride_mp, stride_kb, stride_kh, stride_ks,
                        stride_ob, stride_oh, n_pages, page,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_P: tl.constexpr):
    block = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)
    seq = tl.program_id(2).to(tl.int64)
    position = tl.load(length_ptr + seq) - 1
    current = position // page
    offs_d = tl.arange(0, HEAD_DIM)
    high_head = high_ptr + seq * stride_mb + kv_head * stride_mh
    low_head = low_ptr + seq * stride_mb + kv_head * stride_mh
    if (current >= block * BLOCK_P) & (current < block * BLOCK_P + BLOCK_P):  # this block holds the current page
        # compared in float32 (exact for 16-bit values, which the stores round back to unchanged)
        new_key = tl.load(k_ptr + seq * stride_kb + kv_head * stride_kh + position * stride_ks + offs_d)
        new_key = new_key.to(tl.float32)
        fresh = position % page == 0
        high = tl.load(high_head + current * stride_mp + offs_d).to(tl.float32)
        low = tl.load(low_head + current * stride_mp + offs_d).to(tl.float32)
        bound_type = high_ptr.dtype.element_ty
        tl.store(high_head + current * stride_mp + offs_d,
                 tl.where(fresh, new_key, tl.maximum(high, new_key)).to(bound_type))
        tl.store(low_head + current * stride_mp + offs_d,
                 tl.where(fresh, new_key, tl.minimum(low, new_key)).to(bound_type))
    offs_g = tl.arange(0, BLOCK_G)
    q = tl.load(q_ptr + seq * stride_qb + (kv_head * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :],
                mask=(offs_g < GROUP)[:, None], other=0.0).to(tl.float32)  # [G, D]
    # the group's bound as two products (page_scores_reference's form): sum_g q_g+ with M, sum_g q_g- with m
    positive = tl.sum(tl.maximum(q, 0.0), 0)  # [D]
    negative = tl.sum(tl.minimum(q, 0.0), 0)
    pages = block * BLOCK_P + tl.arange(0, BLOCK_P)
    scored = pages < current
    bounds = pages[:, None] * stride_mp + offs_d[None, :]
    high = tl.load(high_head + bounds, mask=scored[:, None], other=0.0).to(tl.float32)  # [P, D]
    low = tl.load(low_head + bounds, mask=scored[:, None], other=0.0).to(tl.float32)
    total = tl.sum(positive[None, :] * high + negative[None, :] * low, 1)
    tl.store(out_ptr + seq * stride_ob + kv_head * stride_oh + pages, tl.where(scored, total, float("-inf")),
             mask=pages < n_pages)


def page_scores(q: torch.Tensor, highest: torch.Tensor, lowest: torch.Tensor, keys: torch.Tensor,
                lengths: torch.Tensor, page: int, out: torch.Tensor | None = None,
                block_pages: int = BLOCK_PAGES, num_warps: int = PAGE_WARPS) -> torch.Tensor:
    """page_scores_reference in one launch: scores `[B, H_kv, P]` float32; highest/lowest `[B, H_kv, P, D]`
    updated in place. `block_pages` (pages per program, a power of two) and `num_warps` shape the launch only
    (benchmarks/bench_retrieval.py --page-tiles times other shapes)."""
    batch, q_heads, dim = q.shape
    kv_heads, pages = highest.shape[1], highest.shape[2]
    if highest.stride(-1) != 1 or keys.stride(-1) != 1 or q.stride(-1) != 1 or highest.stride() != lowest.stride():
        raise ValueError("page_scores needs unit-stride head dimensions and bounds of one layout")
    out = torch.empty(batch, kv_heads, pages, dtype=torch.float32, device=q.device) if out is None else out
    group = q_heads // kv_heads
    if block_pages < 1 or block_pages & (block_pages - 1):
        raise ValueError(f"page_scores' block_pages must be a power of two, got {block_pages}")
    _page_scores_kernel[(triton.cdiv(pages, block_pages), kv_heads, batch)](
        q, highest, lowest, keys, lengths, out, q.stride(0), q.stride(1), highest.stride(0), highest.stride(1),
        highest.stride(2), keys.stride(0), keys.stride(1), keys.stride(2), out.stride(0), out.stride(1), pages,
        page, GROUP=group, BLOCK_G=triton.next_power_of_2(group), HEAD_DIM=dim, BLOCK_P=block_pages,
        num_warps=num_warps)
    return out


def token_scores_reference(q: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Summed q.k of each KV head's query heads over the slots before the newest (-inf elsewhere)."""
    batch, q_heads, dim = q.shape
    kv_heads, slots = keys.shape[1], keys.shape[2]
    grouped = q.float().view(batch, kv_heads, q_heads // kv_heads, dim)
    scores = torch.einsum("bhgd,bhsd->bhs", grouped, keys.float())
    before = torch.arange(slots, device=q.device)[None, :] < (lengths - 1)[:, None]
    return scores.masked_fill(~before[:, None], float("-inf"))


@triton.jit
def _token_scores_kernel(q_ptr, k_ptr, length_ptr, out_ptr, stride_qb, stride_qh, stride_kb, stride_kh, stride_ks,
                         stride_ob, stride_oh, n_slots,
                         GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_S: tl.constexpr):
    block = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)
    seq = tl.program_id(2).to(tl.int64)
    older = tl.load(length_ptr + seq) - 1  # slots before the newest
    slots = block * BLOCK_S + tl.arange(0, BLOCK_S)
    out = out_ptr + seq * stride_ob + kv_head * stride_oh + slots
    if block * BLOCK_S >= older:  # nothing of this block is scored: no key read
        tl.store(out, tl.full([BLOCK_S], float("-inf"), tl.float32), mask=slots < n_slots)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        offs_g = tl.arange(0, BLOCK_G)
        q = tl.load(q_ptr + seq * stride_qb + (kv_head * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :],
                    mask=(offs_g < GROUP)[:, None], other=0.0).to(tl.float32)
        summed = tl.sum(q, 0)  # sum_g q_g . k = (sum_g q_g) . k
        scored = slots < older
        k = tl.load(k_ptr + seq * stride_kb + kv_head * stride_kh + slots[:, None] * stride_ks + offs_d[None, :],
                    mask=scored[:, None], other=0.0).to(tl.float32)
        tl.store(out, tl.where(scored, tl.sum(k * summed[None, :], 1), float("-inf")), mask=slots < n_slots)


def token_scores(q: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """token_scores_reference in one launch: `[B, H_kv, S]` float32."""
    batch, q_heads, dim = q.shape
    kv_heads, slots = keys.shape[1], keys.shape[2]
    if keys.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("token_scores needs unit-stride head dimensions")
    out = torch.empty(batch, kv_heads, slots, dtype=torch.float32, device=q.device) if out is None else out
    group = q_heads // kv_heads
    _token_scores_kernel[(triton.cdiv(slots, BLOCK_SLOTS), kv_heads, batch)](
        q, keys, lengths, out, q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        out.stride(0), out.stride(1), slots, GROUP=group, BLOCK_G=triton.next_power_of_2(group), HEAD_DIM=dim,
        BLOCK_S=BLOCK_SLOTS, num_warps=4)
    return out


def expand_positions_reference(chosen: torch.Tensor, lengths: torch.Tensor, page: int) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
    """Chosen pages `[B, H_kv, K]` (ascending: the real ones, those before the current page, first) -> the
    slots of the real pages, then those of the current page `[B, H_kv, (K + 1) * page]`, and their count."""
    batch, heads, chosen_pages = chosen.shape
    position = lengths - 1
    current = position // page
    real = torch.minimum(current, torch.tensor(chosen_pages, device=chosen.device))  # [B]
    index = torch.arange((chosen_pages + 1) * page, device=chosen.device)
    in_pages = index[None, :] < (real * page)[:, None]  # [B, N]
    page_of = chosen.gather(2, (index // page).clamp(max=chosen_pages - 1).expand(batch, heads, -1))
    slots_in_pages = page_of * page + index % page
    slots_current = current[:, None] * page + index[None, :] - (real * page)[:, None]
    slots = torch.where(in_pages[:, None], slots_in_pages, slots_current[:, None])
    counts = (real * page + position % page + 1)[:, None].expand(batch, heads)  # + the current page's slots
    valid = index[None, None, :] < counts[..., None]
    return torch.where(valid, slots, 0), counts.contiguous()


@triton.jit
def _expand_positions_kernel(chosen_ptr, length_ptr, positions_ptr, counts_ptr, stride_cb, stride_ch,
                             stride_pb, stride_ph, heads, n_chosen, page,
                             BLOCK: tl.constexpr):
    kv_head = tl.program_id(0).to(tl.int64)
    seq = tl.program_id(1).to(tl.int64)
    block = tl.program_id(2)
    position = tl.load(length_ptr + seq) - 1
    current = position // page
    real = tl.minimum(current, n_chosen)
    count = real * page + position % page + 1
    index = block * BLOCK + tl.arange(0, BLOCK)
    in_pages = index < real * page
    page_of = tl.load(chosen_ptr + seq * stride_cb + kv_head * stride_ch + index // page,
                      mask=in_pages, other=0)
    slots = tl.where(in_pages, page_of * page + index % page, current * page + index - real * page)
    slots = tl.where(index < count, slots, 0)
    tl.store(positions_ptr + seq * stride_pb + kv_head * stride_ph + index, slots,
             mask=index < (n_chosen + 1) * page)
    if block == 0:
        tl.store(counts_ptr + seq * heads + kv_head, count)


def expand_positions(chosen: torch.Tensor, lengths: torch.Tensor, page: int, positions: torch.Tensor,
                     counts: torch.Tensor) -> None:
    """expand_positions_reference in one launch, into `positions [B, H_kv, (K + 1) * page]` and contiguous
    `counts [B, H_kv]`."""
    batch, heads, chosen_pages = chosen.shape
    width = (chosen_pages + 1) * page
    if positions.shape != (batch, heads, width) or counts.shape != (batch, heads) or not counts.is_contiguous():
        raise ValueError(f"positions must be [{batch}, {heads}, {width}] and counts a contiguous [{batch}, {heads}]")
    block = min(1024, triton.next_power_of_2(width))
    _expand_positions_kernel[(heads, batch, triton.cdiv(width, block))](
        chosen, lengths, positions, counts, chosen.stride(0), chosen.stride(1), positions.stride(0),
        positions.stride(1), heads, chosen_pages, page, BLOCK=block, num_warps=4)
