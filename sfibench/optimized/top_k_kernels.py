"""The Selector's top-K in Triton: a radix select of each head's K-th best score, then a parallel compaction.

sfi/selector.top_k_positions keeps, per head, every score above the K-th best and, of the scores equal
to it, the lowest positions, in ascending order. Finding that K-th best with torch.topk took ~0.55 ms
at 128K candidates x 36 layers x 8 KV heads on an H200, and writing the kept positions in order with one
program per head looping over all its candidates 0.27 ms: about a third of the refresh, for a few
passes over 150 MB.

Radix select: a float32 score is mapped to an int32 key with the same order (`_order_key`), and the
K-th best key is found one byte at a time, most significant first. Pass p histograms byte p of the keys
whose higher bytes equal the bytes chosen so far (each program a chunk of one head's candidates, the
chunk histograms summed with atomics); the byte holding the K-th best is where the count from the top
reaches the K still to find. Each program re-derives the bytes chosen before it from the histograms
already complete (`_chosen_prefix`), so the four passes are four launches and nothing else. After the
fourth the key is exact, and so is how many of its ties are kept ("room": K minus the keys above it).

Compaction: each chunk counts its keys above the threshold and its ties (`_count_kept_kernel`); then
each chunk knows from the counts of the chunks before it where its kept positions start and writes them
in order (`_write_kept_kernel`). Every pass reads the scores once, spread over all SMs.

Measured on an H200 (benchmarks/bench_fast_path.py, 128K): 0.77 ms (the
histogram passes 0.57, counting 0.07, writing 0.12) against 1.00 for torch.topk + one compaction program
per head in the same run; at 32K 0.30 against 0.43. The two passes in which nearly every key takes part
(the top byte of typical scores is shared by most of them) cost ~0.18 ms each for 0.04 ms of bytes:
`tl.histogram` is the cost there; the last two skip the tiles where no key is left to rank.

tests/kernels/test_top_k_kernels.py checks positions against top_k_positions under TRITON_INTERPRET, ties,
-inf, -0.0 and K >= n included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BINS = 256  # one byte of the key per pass
PASSES = 4
TILE = 1024  # candidates per loop iteration of every pass
CHUNK_TILES = 8  # tiles per program: 8K candidates, so a 128K head spreads over 16 programs


@triton.jit
def _order_key(score):
    """An int32 that orders like the float32 `score` (-0.0 counted as +0.0, as `==` does)."""
    bits = tl.where(score == 0.0, 0.0, score).to(tl.int32, bitcast=True)
    # Non-negative floats already order as their bit patterns; a negative float's magnitude bits
    # order backwards, so they are flipped (the sign bit stays: every negative key stays below zero).
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _chosen_prefix(hist_ptr, row, rows, k, DONE: tl.constexpr):
    """After DONE passes: the K-th best key's top DONE bytes (as `key >> (32 - 8 DONE)`), and how many of
    the keys sharing them are still to be kept (K minus the keys above them)."""
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], tl.int32)
    still = k
    for p in tl.static_range(DONE):
        hist = tl.load(hist_ptr + (p * rows + row) * 256 + bins)
        at_or_above = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys with this byte or a higher one
        byte = tl.max(tl.where(at_or_above >= still, bins, -1), 0)
        still -= tl.sum(tl.where(bins == byte, at_or_above - hist, 0), 0)
        if p == 0:
            prefix = byte - 128  # the top byte is signed: bins 0..255 hold -128..127
        else:
            prefix = prefix * 256 + byte
    return prefix, still


@triton.jit
def _histogram_kernel(score_ptr, hist_ptr, n, rows, k, chunk, PASS: tl.constexpr, TILE: tl.constexpr):
    """Pass PASS: histogram of key byte PASS (from the top) over one chunk of one head's candidates, of
    the keys whose higher bytes are the ones chosen by the passes before."""
    row, part = tl.program_id(0), tl.program_id(1)
    prefix, _ = _chosen_prefix(hist_ptr, row, rows, k, PASS)
    shift: tl.constexpr = 24 - 8 * PASS
    counts = tl.zeros([256], tl.int32)
    for start in range(part * chunk, tl.minimum(part * chunk + chunk, n), TILE):
        idx = start + tl.arange(0, TILE)
        inside = idx < n
        key = _order_key(tl.load(score_ptr + row.to(tl.int64) * n + idx, mask=inside, other=0.0))
        if PASS == 0:
            counts += tl.histogram((key >> 24) + 128, 256, mask=inside)
        else:
            # After the first pass or two only the keys next to the K-th best still match: most tiles
            # hold none of them and skip the histogram, the costly part.
            match = inside & ((key >> (shift + 8)) == prefix)
            if tl.max(match.to(tl.int32), 0) > 0:
                counts += tl.histogram((key >> shift) & 255, 256, mask=match)
    bins = tl.arange(0, 256)
    tl.atomic_add(hist_ptr + (PASS * rows + row) * 256 + bins, counts, mask=counts > 0)


@triton.jit
def _count_kept_kernel(score_ptr, hist_ptr, kept_ptr, n, rows, k, chunk, TILE: tl.constexpr):
    """Per chunk: how many keys lie above the K-th best, and how many equal it."""
    row, part = tl.program_id(0), tl.program_id(1)
    threshold, _ = _chosen_prefix(hist_ptr, row, rows, k, 4)
    above = tl.zeros([], tl.int32)
    tied = tl.zeros([], tl.int32)
    for start in range(part * chunk, tl.minimum(part * chunk + chunk, n), TILE):
        idx = start + tl.arange(0, TILE)
        key = _order_key(tl.load(score_ptr + row.to(tl.int64) * n + idx, mask=idx < n, other=0.0))
        above += tl.sum(((key > threshold) & (idx < n)).to(tl.int32), 0)
        tied += tl.sum(((key == threshold) & (idx < n)).to(tl.int32), 0)
    out = kept_ptr + (row * tl.num_programs(1) + part) * 2
    tl.store(out, above)
    tl.store(out + 1, tied)


@triton.jit
def _write_kept_kernel(score_ptr, hist_ptr, kept_ptr, out_ptr, n, rows, k, chunk, lo,
                       TILE: tl.constexpr, BLOCK_CHUNKS: tl.constexpr):
    """Writes one chunk's kept positions (+ lo) at their ranks among the head's kept positions."""
    row, part = tl.program_id(0), tl.program_id(1)
    threshold, room = _chosen_prefix(hist_ptr, row, rows, k, 4)
    chunks = tl.arange(0, BLOCK_CHUNKS)
    before = chunks < part
    counts = kept_ptr + (row * tl.num_programs(1) + chunks) * 2
    above_before = tl.sum(tl.load(counts, mask=before, other=0), 0)
    tied_before = tl.sum(tl.load(counts + 1, mask=before, other=0), 0)
    kept_before = above_before + tl.minimum(tied_before, room)
    for start in range(part * chunk, tl.minimum(part * chunk + chunk, n), TILE):
        idx = start + tl.arange(0, TILE)
        key = _order_key(tl.load(score_ptr + row.to(tl.int64) * n + idx, mask=idx < n, other=0.0))
        tied = (key == threshold) & (idx < n)
        keep = (key > threshold) & (idx < n)
        ties_here = tl.sum(tied.to(tl.int32), 0)
        if ties_here > 0:  # a tile without ties (most of them) spares this prefix count
            tied_rank = tied_before + tl.cumsum(tied.to(tl.int32), 0)  # 1-based among the head's ties
            keep = keep | (tied & (tied_rank <= room))
        rank = kept_before + tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.store(out_ptr + row.to(tl.int64) * k + rank, (idx + lo).to(tl.int64), mask=keep & (rank < k))
        kept_before += tl.sum(keep.to(tl.int32), 0)
        tied_before += ties_here


def radix_top_k(scores: torch.Tensor, k: int, lo: int) -> torch.Tensor:
    """sfi/selector.top_k_positions for float32 scores `[..., n]`: the min(k, n) best of each row as
    absolute positions (index + lo), ascending, ties to the lower position."""
    n = scores.shape[-1]
    k = min(k, n)
    flat = scores.reshape(-1, n).contiguous()
    rows = flat.shape[0]
    out = torch.empty(rows, k, dtype=torch.long, device=scores.device)
    if k == 0 or rows == 0:
        return out.view(*scores.shape[:-1], k)
    if flat.dtype != torch.float32:
        raise ValueError(f"radix_top_k ranks float32 scores, got {flat.dtype}")
    chunk = TILE * CHUNK_TILES
    parts = triton.cdiv(n, chunk)
    hist = torch.zeros(PASSES, rows, BINS, dtype=torch.int32, device=scores.device)
    for p in range(PASSES):
        _histogram_kernel[(rows, parts)](flat, hist, n, rows, k, chunk, PASS=p, TILE=TILE, num_warps=4)
    kept = torch.empty(rows, parts, 2, dtype=torch.int32, device=scores.device)
    _count_kept_kernel[(rows, parts)](flat, hist, kept, n, rows, k, chunk, TILE=TILE, num_warps=4)
    _write_kept_kernel[(rows, parts)](flat, hist, kept, out, n, rows, k, chunk, lo, TILE=TILE,
                                      BLOCK_CHUNKS=max(2, triton.next_power_of_2(parts)), num_warps=4)
    return out.view(*scores.shape[:-1], k)


# Rows short enough to sit in one program's registers (Quest's pages: 8,184 per KV head at 128K) are
# ranked in a single launch: the radix select above spends seven launches on them, each too small to
# fill the GPU, once per layer per step.
ROW_BLOCK_MAX = 16384


@triton.jit
def _row_top_k_kernel(score_ptr, out_ptr, n, k, lo, BLOCK: tl.constexpr):
    """One program per row: a binary search over the int32 keys for the K-th best (32 counts of the keys
    at or above a guess, all in registers), then the kept positions written in order by a prefix sum."""
    row = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, BLOCK)
    valid = idx < n
    key = _order_key(tl.load(score_ptr + row * n + idx, mask=valid, other=0.0))
    low = tl.full([], -2147483648, tl.int64)  # invariant: at least k keys are >= low (k <= n)
    high = tl.full([], 2147483647, tl.int64)
    for _ in range(32):
        guess = low + (high - low + 1) // 2
        count = tl.sum((valid & (key >= guess.to(tl.int32))).to(tl.int32), 0)
        low = tl.where(count >= k, guess, low)
        high = tl.where(count >= k, high, guess - 1)
    threshold = low.to(tl.int32)  # the K-th best key
    above = valid & (key > threshold)
    tied = valid & (key == threshold)
    room = k - tl.sum(above.to(tl.int32), 0)
    keep = above | (tied & (tl.cumsum(tied.to(tl.int32), 0) <= room))  # ties to the lowest positions
    rank = tl.cumsum(keep.to(tl.int32), 0) - 1
    tl.store(out_ptr + row * k + rank, (idx + lo).to(tl.int64), mask=keep)


def top_k(scores: torch.Tensor, k: int, lo: int) -> torch.Tensor:
    """radix_top_k's answer, in one launch where a row fits one program (n <= ROW_BLOCK_MAX)."""
    n = scores.shape[-1]
    if n > ROW_BLOCK_MAX:
        return radix_top_k(scores, k, lo)
    k = min(k, n)
    flat = scores.reshape(-1, n).contiguous()
    out = torch.empty(flat.shape[0], k, dtype=torch.long, device=scores.device)
    if k == 0 or flat.shape[0] == 0:
        return out.view(*scores.shape[:-1], k)
    if flat.dtype != torch.float32:
        raise ValueError(f"top_k ranks float32 scores, got {flat.dtype}")
    block = max(triton.next_power_of_2(n), 128)
    _row_top_k_kernel[(flat.shape[0],)](flat, out, n, k, lo, BLOCK=block, num_warps=min(16, max(4, block // 1024)))
    return out.view(*scores.shape[:-1], k)
