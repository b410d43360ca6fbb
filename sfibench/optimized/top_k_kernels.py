"""Top-K in Triton: every row's K best scores as positions, ascending, ties to the lower position.

sfi/selector.top_k_positions is the oracle: per row, every score above the K-th best and, of the scores
equal to it, the lowest positions, in ascending order. Two rankings give exactly its answer: the radix
select (the Selector's, and any row too long for the split ranking) and `top_k`, the split ranking of
the retrieval methods' pages and tokens, below the radix select.

The radix select. Finding the Selector's K-th best with torch.topk took ~0.55 ms at 128K candidates x 36
layers x 8 KV heads on an H200, and writing the kept positions in order with one program per head looping
over all its candidates 0.27 ms: about a third of the refresh, for a few passes over 150 MB.

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

A row's chunks are at least as many as fill the SMs (decode_attention.default_num_splits over the rows), in
whole tiles, so a few rows still spread over the GPU; many rows (the Selector's 36 layers x 8 KV heads) keep
8K candidates a chunk.

The split ranking (`top_k`). Quest ranks ~8K page bounds per (sequence, KV head) at 128K for K = 143, in
every sparse layer of every step; one program per row is 8 programs on a 132-SM GPU at B = 1, each
ranking serially. `top_k` cuts each row into as many chunks as fill the SMs (the same split count as the
dense decode kernel's for that many rows), capped so a chunk holds at least 2K scores: one program per
chunk keeps its chunk's K best (score, position) as candidates, in ascending position, and one program
per row ranks the candidates. The K best of a row are among its chunks' K best (a score has fewer than
K better ones in its chunk when it has fewer than K in its row, ties to the lower position counted as
better), so the merge gives exactly the one-pass answer. Both passes rank in registers by a binary
search over the int32 keys (`_keep_best`). A select by threshold was the other choice: its passes each
read the whole row, where the merge reads only splits x K candidates, and it takes seven launches to the
split ranking's two.

Where no split pays (chunks of 2K scores would be too few, or their candidates more than MERGE_MAX:
TidalDecode's K = 2,307 tokens at 8K-128K, Quest's pages at 8K) one program ranks a row of up to
MERGE_MAX scores, or of up to ROW_BLOCK_MAX where the rows alone fill the SMs; a longer row goes to the
radix select, spread over the SMs.

Quest's scoring is the first pass itself (retrieval_kernels.top_pages, through `keep_chunk_best`,
`candidate_layout` and `merge_candidates`): the bounds are read once either way, and the split ranking
then takes two launches with the scoring, as many as the scoring plus a one-program ranking.

tests/kernels/test_top_k_kernels.py checks both rankings against top_k_positions under TRITON_INTERPRET:
ties, -inf, -0.0, K >= n, several chunks and forced split counts on small rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sfibench.optimized.decode_attention import default_num_splits, sm_count

BINS = 256  # one byte of the key per pass
PASSES = 4
TILE = 1024  # candidates per loop iteration of every pass
CHUNK_TILES = 8  # tiles per program at most: 8K candidates, so a 128K head spreads over 16 programs


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
    fill = default_num_splits(rows, 1, n, sm_count(scores.device))
    parts = max(triton.cdiv(n, TILE * CHUNK_TILES), min(fill, triton.cdiv(n, TILE)))
    chunk = triton.cdiv(triton.cdiv(n, parts), TILE) * TILE  # whole tiles: no tile straddles two chunks
    parts = triton.cdiv(n, chunk)
    hist = torch.zeros(PASSES, rows, BINS, dtype=torch.int32, device=scores.device)
    for p in range(PASSES):
        _histogram_kernel[(rows, parts)](flat, hist, n, rows, k, chunk, PASS=p, TILE=TILE, num_warps=4)
    kept = torch.empty(rows, parts, 2, dtype=torch.int32, device=scores.device)
    _count_kept_kernel[(rows, parts)](flat, hist, kept, n, rows, k, chunk, TILE=TILE, num_warps=4)
    _write_kept_kernel[(rows, parts)](flat, hist, kept, out, n, rows, k, chunk, lo, TILE=TILE,
                                      BLOCK_CHUNKS=max(2, triton.next_power_of_2(parts)), num_warps=4)
    return out.view(*scores.shape[:-1], k)



ROW_BLOCK_MAX = 16384  # the most scores one program ranks in registers
MERGE_MAX = 4096  # the most candidates (chunks x K) the split ranking's merge takes


@triton.jit
def _keep_best(key, valid, k):
    """Which of the valid lanes hold the k best keys (ties to the lower lanes): a binary search over the
    int32 keys for the k-th best (32 counts of the keys at or above a guess), then a prefix count of its
    ties. k <= the valid lanes."""
    low = tl.full([], -2147483648, tl.int64)  # invariant: at least k keys are >= low
    high = tl.full([], 2147483647, tl.int64)
    for _ in range(32):
        guess = low + (high - low + 1) // 2
        count = tl.sum((valid & (key >= guess.to(tl.int32))).to(tl.int32), 0)
        low = tl.where(count >= k, guess, low)
        high = tl.where(count >= k, high, guess - 1)
    threshold = low.to(tl.int32)  # the k-th best key
    above = valid & (key > threshold)
    tied = valid & (key == threshold)
    room = k - tl.sum(above.to(tl.int32), 0)
    return above | (tied & (tl.cumsum(tied.to(tl.int32), 0) <= room))


@triton.jit
def keep_chunk_best(score, pos, valid, kept, cand_score_ptr, cand_pos_ptr, slots, width,
                     BLOCK: tl.constexpr):
    """The `kept` best of one chunk's valid lanes (positions `pos`, ascending with the lanes) as (score,
    position) in candidate slots [slots, slots + kept), ascending; slots [kept, width) get position -1."""
    lane = tl.arange(0, BLOCK)
    keep = _keep_best(_order_key(score), valid, kept)
    rank = tl.cumsum(keep.to(tl.int32), 0) - 1
    tl.store(cand_score_ptr + slots + rank, score, mask=keep)
    tl.store(cand_pos_ptr + slots + rank, pos, mask=keep)
    empty = (lane >= kept) & (lane < width)
    tl.store(cand_pos_ptr + slots + lane, tl.full([BLOCK], -1, tl.int32), mask=empty)


@triton.jit
def _chunk_best_kernel(score_ptr, cand_score_ptr, cand_pos_ptr, n, k, chunk, width, BLOCK: tl.constexpr):
    """One chunk of one row: its min(k, chunk length) best, in the row's candidate slots of this chunk."""
    part, row = tl.program_id(0), tl.program_id(1).to(tl.int64)
    lane = tl.arange(0, BLOCK)
    pos = part * chunk + lane
    valid = (lane < chunk) & (pos < n)
    score = tl.load(score_ptr + row * n + pos, mask=valid, other=0.0)
    kept = tl.minimum(k, tl.minimum(chunk, n - part * chunk))
    slots = (row * tl.num_programs(0) + part) * width
    keep_chunk_best(score, pos, valid, kept, cand_score_ptr, cand_pos_ptr, slots, width, BLOCK)


@triton.jit
def _row_best_kernel(score_ptr, pos_ptr, out_ptr, n, k, lo, HAS_POS: tl.constexpr, BLOCK: tl.constexpr):
    """One row: its k best as positions + lo, ascending. HAS_POS: the row is the chunks' candidates, each
    with its position (-1: an empty slot), already ascending; otherwise lane i is position i."""
    row = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK)
    inside = lane < n
    score = tl.load(score_ptr + row * n + lane, mask=inside, other=0.0)
    if HAS_POS:
        pos = tl.load(pos_ptr + row * n + lane, mask=inside, other=-1)
        valid = inside & (pos >= 0)
    else:
        pos = lane
        valid = inside
    keep = _keep_best(_order_key(score), valid, k)
    rank = tl.cumsum(keep.to(tl.int32), 0) - 1
    tl.store(out_ptr + row * k + rank, (pos + lo).to(tl.int64), mask=keep)


def ranking_splits(rows: int, n: int, k: int, sms: int) -> int:
    """Chunks per row for `top_k`: as many as fill the SMs (default_num_splits over `rows` rows), while
    each chunk holds at least 2K scores (so the merge ranks at most half the row) and the merge's
    candidates fit MERGE_MAX; 1 where no split pays (one program per row, or the radix select)."""
    splits = min(default_num_splits(rows, 1, n, sms), n // (2 * k))
    fits = splits * k <= MERGE_MAX and triton.cdiv(n, max(splits, 1)) <= ROW_BLOCK_MAX
    return splits if splits >= 2 and fits else 1


def ranking_warps(block: int) -> int:
    """Warps of a ranking program over `block` lanes: 4, up to 16 for the longest rows."""
    return min(16, max(4, block // 1024))


def top_k(scores: torch.Tensor, k: int, lo: int, num_splits: int | None = None) -> torch.Tensor:
    """top_k_positions for float32 scores `[..., n]`: the min(k, n) best of each row as positions + lo,
    ascending, ties to the lower position. `num_splits` (default: ranking_splits) chunks per row; 1 ranks
    each row in one program (a row longer than ROW_BLOCK_MAX: the radix select)."""
    n = scores.shape[-1]
    k = min(k, n)
    flat = scores.reshape(-1, n).contiguous()
    rows = flat.shape[0]
    out = torch.empty(rows, k, dtype=torch.long, device=scores.device)
    if k == 0 or rows == 0:
        return out.view(*scores.shape[:-1], k)
    if flat.dtype != torch.float32:
        raise ValueError(f"top_k ranks float32 scores, got {flat.dtype}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1 (or None for the default), got {num_splits}")
    sms = sm_count(scores.device)
    splits = num_splits or ranking_splits(rows, n, k, sms)
    if splits == 1:
        rows_fill_the_gpu = default_num_splits(rows, 1, n, sms) == 1
        if n > ROW_BLOCK_MAX or (num_splits is None and n > MERGE_MAX and not rows_fill_the_gpu):
            return radix_top_k(scores, k, lo)
        block = max(128, triton.next_power_of_2(n))
        _row_best_kernel[(rows,)](flat, flat, out, n, k, lo, HAS_POS=False, BLOCK=block,
                                  num_warps=ranking_warps(block))
        return out.view(*scores.shape[:-1], k)
    chunk, splits, width = candidate_layout(n, k, splits)
    cand_score, cand_pos = candidate_buffers(rows, splits, width, scores.device)
    block = max(128, triton.next_power_of_2(chunk))
    _chunk_best_kernel[(splits, rows)](flat, cand_score, cand_pos, n, k, chunk, width, BLOCK=block,
                                       num_warps=ranking_warps(block))
    merge_candidates(cand_score, cand_pos, out, k, lo)
    return out.view(*scores.shape[:-1], k)


def candidate_layout(n: int, k: int, splits: int) -> tuple[int, int, int]:
    """Rows of n scores in `splits` chunks: (scores a chunk, chunks, candidates a chunk), no chunk empty."""
    chunk = triton.cdiv(n, splits)
    splits = triton.cdiv(n, chunk)
    width = min(k, chunk)
    if max(chunk, splits * width) > ROW_BLOCK_MAX:
        raise ValueError(f"{splits} chunks of {chunk} scores, K = {k}: a chunk and the candidates must fit "
                         f"{ROW_BLOCK_MAX} scores; pass more splits or None")
    return chunk, splits, width


def candidate_buffers(rows: int, splits: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's chunks' candidates: float32 scores and int32 positions `[rows, splits, width]`."""
    return (torch.empty(rows, splits, width, dtype=torch.float32, device=device),
            torch.empty(rows, splits, width, dtype=torch.int32, device=device))


def merge_candidates(cand_score: torch.Tensor, cand_pos: torch.Tensor, out: torch.Tensor, k: int,
                     lo: int) -> None:
    """The k best of each row's candidates as positions + lo, ascending, into out `[rows, k]`."""
    rows, splits, width = cand_score.shape
    block = max(128, triton.next_power_of_2(splits * width))
    _row_best_kernel[(rows,)](cand_score, cand_pos, out, splits * width, k, lo, HAS_POS=True, BLOCK=block,
                              num_warps=ranking_warps(block))
