"""The SFI Selector in Triton passes over the evidence, for the optimized path's refreshes.

sfi/selector.py states the Selector stage by stage in PyTorch: about forty whole-tensor operations,
each a pass over `[layers, H_kv, R, n]` float32 logits (at 128K candidates and 36 layers, 600 MB).
On an H200 that took ~12 ms per refresh, and the optimized path runs it beside decoding, where every
pass also steals bandwidth from the fast steps. The same arithmetic in five launches:

1. `_row_lse_kernel`: each evidence row's log-sum-exp over the candidates (its softmax normaliser).
2. `_pool_stats_kernel`: per (layer, KV head), the pooled log f (power mean of the rows) and the
   prior's log r at every candidate, reduced to the five log-sums the fusion needs: LSE(log f),
   LSE(2 log f), LSE(log r), LSE(2 log r), LSE(log f + log r). Chunked over positions, so every SM
   has work. It also stores log f and log r: recomputing them in (4) from the logits cost more than
   reading them back (on an H200 at 128K the fusion took 0.62 ms recomputing). The prior's position
   term, the same for every (layer, head), is computed once per refresh and read.
3. `_mix_kernel`: per (layer, KV head) the chunks' partial sums merged and lambda chosen.
4. `_fuse_kernel`: log s = log((1 - lambda) f + lambda r) at every candidate.
5. `_nms_cross_head_kernel`: Soft-NMS (the window max read straight from (4)'s output, which the
   cache serves) and the cross-head exclusivity, all KV heads of a layer in one tile. (Running maxima
   over blocks of 2 x radius, van Herk's, take 3 loads per candidate instead of 2 x radius + 1; written
   into the fusion they cost 1.08 ms against its 0.11 and Soft-NMS rose to 0.61 ms from 0.34 on an
   H200 at 128K, so the window max reads the cache instead.)

Then the top-K (optimized/top_k_kernels.py): a radix select of each head's K-th best score and a
parallel compaction of the kept positions in ascending order, as sfi/selector.top_k_positions does.

The result equals `select` up to float32 rounding of the log-sums (a reordered sum), so where two
candidates' scores differ by less than that the choice may differ; tests/kernels/test_selector_kernels.py
checks scores and positions against `select` on random evidence under TRITON_INTERPRET. Only the
SPEC evidence norm ("candidates") runs here: SFI's optimized path (optimized/sfi.py `fused_select`)
hands the visible-norm ablation to `select`. The kernels take the Selector's numbers as `ScoreParams`,
plain values the SFI method copies from its SelectorConfig.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl



@dataclass(frozen=True)
class ScoreParams:
    """The Selector's numbers the score kernels use (SPEC section 5; the fields of sfi/selector.py's
    SelectorConfig of the same names)."""

    alpha: float  # power-mean exponent pooling the evidence rows
    use_prior: bool
    gamma: float  # the prior: key-norm exponent, weights, position curve
    w_norm: float
    w_pos: float
    pos_p: float
    eta: float
    beta: float
    lambda_fixed: float | None  # a fixed fusion weight in place of the closed form
    lambda_clip_multi: float  # the closed form's clip with R > 1 evidence rows
    lambda_clip_single: float  # and with R == 1
    use_nms: bool
    nms_radius: int
    nms_alpha: float
    use_cross_head: bool
    cross_temperature: float
    cross_alpha: float
    eps: float


@dataclass(frozen=True)
class SelectorTiles:
    """How `fused_scores` cuts the work into programs (same result up to the order of float32 sums).

    Chosen by `python benchmarks/bench_fast_path.py --selector-tiles 130944` on an H200 (36 layers x 8 KV
    heads x 130,688 candidates):
    the passes that only stream (row normalisers, fusion) are fastest on 2,048-wide tiles (0.150 and
    0.115 ms against 0.175 and 0.135 on 1,024), pooling, which holds more per candidate, on 512-wide
    tiles in 1,024-candidate chunks (0.42 ms against 0.46); Soft-NMS barely moves with its tile."""

    stream_block: int = 2048  # candidates per tile of the row normalisers and the fusion
    block: int = 512  # candidates per tile of the pooling
    chunk_blocks: int = 2  # tiles per pooling program
    pool_warps: int = 4  # warps per program of the row normalisers, pooling and fusion
    nms_tile: int = 256  # candidates per [KV heads, tile] program of Soft-NMS + cross-head
    nms_warps: int = 4

    def __post_init__(self):
        for name in ("stream_block", "block", "nms_tile", "pool_warps", "nms_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"SelectorTiles.{name} must be a power of two, got {value}")
        if self.chunk_blocks < 1:
            raise ValueError(f"SelectorTiles.chunk_blocks must be >= 1, got {self.chunk_blocks}")


@triton.jit
def _log_add_exp(a, b):
    """log(exp a + exp b), -inf when both are (never NaN)."""
    top = tl.maximum(a, b)
    safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.exp(a - safe) + tl.exp(b - safe)
    return tl.where(top == float("-inf"), top, safe + tl.log(tl.where(total > 0, total, 1.0)))


@triton.jit
def _online_lse(run_max, run_sum, values):
    """Fold a tile of values into a running (max, sum of exp(v - max)) pair."""
    new_max = tl.maximum(run_max, tl.max(values, 0))
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(values - shift), 0)
    return new_max, run_sum


@triton.jit
def _row_lse_kernel(logits_ptr, lse_ptr, stride_l, stride_h, stride_r, stride_n, n, heads, rows,
                    BLOCK: tl.constexpr):
    program = tl.program_id(0)  # one evidence row: (layer, head, row)
    layer, rest = program // (heads * rows), program % (heads * rows)
    base = logits_ptr + layer.to(tl.int64) * stride_l + (rest // rows) * stride_h + (rest % rows) * stride_r
    offs = tl.arange(0, BLOCK)
    run_max = tl.full([], float("-inf"), tl.float32)
    run_sum = tl.zeros([], tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(base + (start + offs) * stride_n, mask=start + offs < n, other=float("-inf"))
        run_max, run_sum = _online_lse(run_max, run_sum, x)
    run_sum = tl.where(run_sum > 0, run_sum, 1.0)  # only when the row is -inf everywhere
    tl.store(lse_ptr + program, tl.where(run_max == float("-inf"), run_max, run_max + tl.log(run_sum)))


@triton.jit
def _pooled_and_prior(logits_ptr, lse_ptr, norms_ptr, position_ptr, pair, layer, head, idx, n,
                      stride_l, stride_h, stride_r, stride_n, stride_nl, stride_nh, stride_nn,
                      alpha, log_rows, has_rows, gamma, w_norm, w_pos, eps,
                      ROWS: tl.constexpr, USE_PRIOR: tl.constexpr):
    """log_pooled (before its normalisation over n) and the prior's logit (before its softmax) at `idx`."""
    inside = idx < n
    base = logits_ptr + layer * stride_l + head * stride_h
    # log Σ_r exp(alpha log p_r) as max + log Σ exp(. - max): one exp per row and one log, where adding
    # the rows one at a time (log-add-exp) took two exps and a log per row. The rows are read twice
    # (the second time from the cache) rather than held: R is not bounded.
    top = tl.full(idx.shape, float("-inf"), tl.float32)
    for r in tl.static_range(ROWS):
        row_lse = tl.load(lse_ptr + pair * ROWS + r)
        x = tl.load(base + r * stride_r + idx * stride_n, mask=inside, other=float("-inf"))
        valid = row_lse > float("-inf")  # a row masked everywhere is left out of the pool
        top = tl.maximum(top, tl.where(valid, alpha * (x - tl.where(valid, row_lse, 0.0)), float("-inf")))
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros(idx.shape, tl.float32)
    for r in tl.static_range(ROWS):
        row_lse = tl.load(lse_ptr + pair * ROWS + r)
        x = tl.load(base + r * stride_r + idx * stride_n, mask=inside, other=float("-inf"))
        valid = row_lse > float("-inf")
        total += tl.exp(tl.where(valid, alpha * (x - tl.where(valid, row_lse, 0.0)), float("-inf")) - shift)
    pooled = tl.where(top == float("-inf"), top, shift + tl.log(tl.where(total > 0, total, 1.0)))
    pooled = tl.where(has_rows, (pooled - log_rows) / alpha, 0.0)  # no valid row at all: uniform f
    prior = tl.zeros(idx.shape, tl.float32)
    if USE_PRIOR:
        norm = tl.load(norms_ptr + layer * stride_nl + head * stride_nh + idx * stride_nn, mask=inside, other=1.0)
        position_term = tl.load(position_ptr + idx, mask=inside, other=0.0)  # the same for every head
        prior = w_norm * (-gamma * tl.log(tl.maximum(norm.to(tl.float32), eps))) + w_pos * position_term
    return tl.where(inside, pooled, float("-inf")), tl.where(inside, prior, float("-inf"))


@triton.jit
def _pool_stats_kernel(logits_ptr, lse_ptr, norms_ptr, position_ptr, stats_ptr, pooled_ptr,
                       prior_ptr, n, heads, chunk,
                       stride_l, stride_h, stride_r, stride_n, stride_nl, stride_nh, stride_nn,
                       alpha, gamma, w_norm, w_pos, eps,
                       ROWS: tl.constexpr, USE_PRIOR: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_ROWS: tl.constexpr):
    """Partial (max, sum) of five log-sums over one chunk of candidates of one (layer, KV head), and the
    pooled log f and prior log r at each candidate (for the fusion, so it need not read the logits again)."""
    pair, part = tl.program_id(0), tl.program_id(1)
    layer, head = (pair // heads).to(tl.int64), pair % heads
    rows = tl.arange(0, BLOCK_ROWS)
    row_lse = tl.load(lse_ptr + pair * ROWS + rows, mask=rows < ROWS, other=float("-inf"))
    valid_rows = tl.sum((row_lse > float("-inf")).to(tl.float32), 0)  # R counts the rows that see a candidate
    has_rows = valid_rows > 0
    log_rows = tl.log(tl.maximum(valid_rows, 1.0))
    offs = tl.arange(0, BLOCK)
    # Running (max, sum) pairs of LSE(log f), LSE(2 log f), LSE(log r), LSE(2 log r), LSE(log f + log r).
    m0 = tl.full([], float("-inf"), tl.float32)
    s0 = tl.zeros([], tl.float32)
    m1, m2, m3, m4 = m0, m0, m0, m0
    s1, s2, s3, s4 = s0, s0, s0, s0
    for start in range(part * chunk, tl.minimum(part * chunk + chunk, n), BLOCK):
        lp, pr = _pooled_and_prior(logits_ptr, lse_ptr, norms_ptr, position_ptr, pair, layer, head, start + offs,
                                   n, stride_l, stride_h, stride_r, stride_n, stride_nl, stride_nh, stride_nn,
                                   alpha, log_rows, has_rows, gamma, w_norm, w_pos, eps, ROWS, USE_PRIOR)
        idx = start + offs
        tl.store(pooled_ptr + pair.to(tl.int64) * n + idx, lp, mask=idx < n)
        if USE_PRIOR:
            tl.store(prior_ptr + pair.to(tl.int64) * n + idx, pr, mask=idx < n)
        m0, s0 = _online_lse(m0, s0, lp)
        m1, s1 = _online_lse(m1, s1, 2 * lp)
        m2, s2 = _online_lse(m2, s2, pr)
        m3, s3 = _online_lse(m3, s3, 2 * pr)
        m4, s4 = _online_lse(m4, s4, lp + pr)
    slot = tl.arange(0, 8)  # stored as [maxes 0..4, pad, sums 8..12, pad]: power-of-two vectors
    maxes = tl.where(slot == 0, m0, tl.where(slot == 1, m1, tl.where(slot == 2, m2, tl.where(slot == 3, m3, m4))))
    sums = tl.where(slot == 0, s0, tl.where(slot == 1, s1, tl.where(slot == 2, s2, tl.where(slot == 3, s3, s4))))
    out = stats_ptr + (pair * tl.num_programs(1) + part) * 16
    tl.store(out + slot, maxes, mask=slot < 5)
    tl.store(out + 8 + slot, sums, mask=slot < 5)


@triton.jit
def _fuse_kernel(pooled_ptr, prior_ptr, mix_ptr, out_ptr, n, USE_PRIOR: tl.constexpr, BLOCK: tl.constexpr):
    """log s at one tile of candidates of one (layer, KV head) from (2)'s log f and log r; `mix` holds
    per pair the two offsets [log(1 - lambda) - LSE(log f), log lambda - LSE(log r)] (-inf for a
    dropped branch)."""
    pair, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    idx = block * BLOCK + tl.arange(0, BLOCK)
    inside = idx < n
    tl.store(out_ptr + pair * n + idx, _fused_score(pooled_ptr, prior_ptr, mix_ptr, pair, idx, inside, n, USE_PRIOR),
             mask=inside)


@triton.jit
def _fused_score(pooled_ptr, prior_ptr, mix_ptr, pair, idx, inside, n, USE_PRIOR: tl.constexpr):
    """log s at candidates `idx` of one (layer, KV head) (-inf outside `inside`)."""
    score = tl.load(pooled_ptr + pair * n + idx, mask=inside, other=float("-inf")) + tl.load(mix_ptr + pair * 2)
    if USE_PRIOR:
        prior = tl.load(prior_ptr + pair * n + idx, mask=inside, other=float("-inf"))
        score = _log_add_exp(score, prior + tl.load(mix_ptr + pair * 2 + 1))
    return tl.where(inside, score, float("-inf"))


@triton.jit
def _nms_cross_head_kernel(score_ptr, out_ptr, n, heads, radius, nms_alpha, inv_temperature, cross_alpha, log_eps,
                           USE_NMS: tl.constexpr, USE_CROSS: tl.constexpr, BLOCK_H: tl.constexpr,
                           BLOCK: tl.constexpr):
    """Soft-NMS then cross-head exclusivity on a [KV heads, BLOCK] tile of one layer."""
    layer, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    idx = block * BLOCK + tl.arange(0, BLOCK)
    head_offsets = (layer * heads + offs_h)[:, None] * n
    rows = score_ptr + head_offsets
    real = (offs_h < heads)[:, None] & (idx < n)[None, :]
    score = tl.load(rows + idx[None, :], mask=real, other=float("-inf"))
    if USE_NMS:
        # The window is truncated at the ends of C: positions outside read as -inf and never win. Only
        # tiles within `radius` of an end need that test; the others (all but two per layer) skip it.
        window = score
        if (block * BLOCK < radius) | (block * BLOCK + BLOCK + radius > n):  # a tile near an end of C
            for offset in range(-radius, radius + 1):
                at = idx + offset
                near = tl.load(rows + at[None, :],
                               mask=(offs_h < heads)[:, None] & ((at >= 0) & (at < n))[None, :], other=float("-inf"))
                window = tl.maximum(window, near)
        else:
            head_rows = (offs_h < heads)[:, None] & (idx >= 0)[None, :]  # the head mask at the tile's shape
            for offset in range(-radius, radius + 1):
                window = tl.maximum(window, tl.load(rows + (idx + offset)[None, :], mask=head_rows,
                                                    other=float("-inf")))
        finite = score > float("-inf")  # -inf stays -inf (and -inf - -inf is never formed)
        below_peak = tl.where(finite, window, 0.0) - tl.where(finite, score, 0.0)
        suppressed = score - nms_alpha * tl.maximum(below_peak, 0.0)
        score = tl.where(finite, suppressed, score)
    if USE_CROSS:
        scaled = tl.where(real, score * inv_temperature, float("-inf"))
        top = tl.max(scaled, 0)
        safe = tl.where(top == float("-inf"), 0.0, top)
        total = tl.sum(tl.exp(scaled - safe[None, :]), 0)
        log_total = safe + tl.log(tl.where(total > 0, total, 1.0))  # 0 only where every head is -inf
        log_rho = tl.maximum(tl.where(scaled > float("-inf"), scaled - log_total[None, :], log_eps), log_eps)
        score = tl.where(score == float("-inf"), score, score + cross_alpha * log_rho)
    tl.store(out_ptr + head_offsets + idx[None, :], score, mask=real)


@triton.jit
def _merged_log_sum(stats_ptr, pair, parts, slot, BLOCK_PARTS: tl.constexpr):
    """One of the five log-sums of a (layer, KV head) from its chunks' (max, sum) partials."""
    part = tl.arange(0, BLOCK_PARTS)
    at = stats_ptr + (pair * parts + part) * 16 + slot
    maxes = tl.load(at, mask=part < parts, other=float("-inf"))
    sums = tl.load(at + 8, mask=part < parts, other=0.0)
    top = tl.max(maxes, 0)
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(tl.where(maxes == float("-inf"), 0.0, sums * tl.exp(maxes - shift)), 0)
    return tl.where(total > 0, shift + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))


@triton.jit
def _mix_kernel(stats_ptr, mix_ptr, parts, lambda_fixed, clip, eps,
                USE_PRIOR: tl.constexpr, FIXED: tl.constexpr, BLOCK_PARTS: tl.constexpr):
    """Per (layer, KV head) the fusion's [log(1 - lambda) - LSE(log f), log lambda - LSE(log r)] (-inf for
    a dropped branch), lambda chosen as sfi/selector.choose_lambda does from the sums Σf², Σfr, Σr²
    written as log-sums. One launch: as ~20 PyTorch operations on these tiny tensors, the host's launch
    gaps cost more than the work."""
    pair = tl.program_id(0)
    lse_f = _merged_log_sum(stats_ptr, pair, parts, 0, BLOCK_PARTS)
    if USE_PRIOR:
        lse_r = _merged_log_sum(stats_ptr, pair, parts, 2, BLOCK_PARTS)
        if FIXED:
            lam = lambda_fixed
        else:
            sum_ff = tl.exp(_merged_log_sum(stats_ptr, pair, parts, 1, BLOCK_PARTS) - 2 * lse_f)
            sum_rr = tl.exp(_merged_log_sum(stats_ptr, pair, parts, 3, BLOCK_PARTS) - 2 * lse_r)
            sum_fr = tl.exp(_merged_log_sum(stats_ptr, pair, parts, 4, BLOCK_PARTS) - lse_f - lse_r)
            lam = (sum_ff - sum_fr) / tl.maximum(sum_ff - 2 * sum_fr + sum_rr, eps)
            lam = tl.minimum(tl.maximum(lam, 0.0), clip)
        log_weight_prior = tl.where(lam > eps, tl.log(tl.maximum(lam, eps)), float("-inf"))
        log_weight_evidence = tl.where(1 - lam > eps, tl.log(tl.maximum(1 - lam, eps)), float("-inf"))
        tl.store(mix_ptr + pair * 2, log_weight_evidence - lse_f)
        tl.store(mix_ptr + pair * 2 + 1, log_weight_prior - lse_r)
    else:
        tl.store(mix_ptr + pair * 2, -lse_f)
        tl.store(mix_ptr + pair * 2 + 1, float("-inf"))


def fused_scores(logits: torch.Tensor, key_norms: torch.Tensor, cfg: ScoreParams,
                 tiles: SelectorTiles = SelectorTiles()) -> torch.Tensor:
    """The Selector's final score `[L, H, n]` (float32) from evidence logits `[L, H, R, n]` (float32, any
    strides) and key norms `[L, H, n]`: what `select` ranks, before the neighbour pool and the top-K."""
    layers, heads, rows, n = logits.shape
    if logits.dtype != torch.float32:
        raise ValueError(f"evidence logits must be float32, got {logits.dtype}")
    if key_norms.shape != (layers, heads, n):
        raise ValueError(f"key_norms must be [L, H, n] = {[layers, heads, n]}, got {list(key_norms.shape)}")
    pairs, device = layers * heads, logits.device
    strides = (*logits.stride(), *key_norms.stride())
    prior = (cfg.gamma, cfg.w_norm, cfg.w_pos, cfg.eps)
    # The prior's position term depends on the position only: once per refresh, not per (layer, head).
    u = torch.arange(n, device=device, dtype=torch.float32) / max(n - 1, 1)
    position_term = -cfg.beta * u.pow(cfg.pos_p) + cfg.eta * (1 - u).clamp_min(cfg.eps).log()

    row_lse = torch.empty(pairs * rows, device=device, dtype=torch.float32)
    block, warps = tiles.block, tiles.pool_warps
    _row_lse_kernel[(pairs * rows,)](logits, row_lse, *logits.stride(), n, heads, rows,
                                     BLOCK=tiles.stream_block, num_warps=warps)

    chunk = block * tiles.chunk_blocks
    parts = triton.cdiv(n, chunk)
    stats = torch.empty(pairs, parts, 16, device=device, dtype=torch.float32)
    pooled = torch.empty(layers, heads, n, device=device, dtype=torch.float32)
    prior_logits = torch.empty_like(pooled) if cfg.use_prior else pooled  # unused without the prior
    _pool_stats_kernel[(pairs, parts)](logits, row_lse, key_norms, position_term, stats, pooled,
                                       prior_logits, n, heads, chunk, *strides, cfg.alpha, *prior, ROWS=rows,
                                       USE_PRIOR=cfg.use_prior, BLOCK=block,
                                       BLOCK_ROWS=triton.next_power_of_2(rows), num_warps=warps)
    fixed = cfg.lambda_fixed is not None
    if fixed and not 0.0 <= cfg.lambda_fixed <= 1.0:
        raise ValueError(f"lambda_fixed must lie in [0, 1], got {cfg.lambda_fixed}")
    mix = torch.empty(pairs, 2, device=device, dtype=torch.float32)
    _mix_kernel[(pairs,)](stats, mix, parts, cfg.lambda_fixed if fixed else 0.0,
                          cfg.lambda_clip_multi if rows > 1 else cfg.lambda_clip_single, cfg.eps,
                          USE_PRIOR=cfg.use_prior, FIXED=fixed, BLOCK_PARTS=max(2, triton.next_power_of_2(parts)),
                          num_warps=1)

    fused = pooled  # written in place: each program reads its tile's log f and prior, then overwrites it
    radius = min(cfg.nms_radius, n - 1)
    _fuse_kernel[(pairs, triton.cdiv(n, tiles.stream_block))](pooled, prior_logits, mix, fused, n,
                                                              USE_PRIOR=cfg.use_prior, BLOCK=tiles.stream_block,
                                                              num_warps=warps)
    use_cross = cfg.use_cross_head and heads > 2  # SPEC skips the stage with one or two KV heads
    if not (cfg.use_nms or use_cross):
        return fused
    final = torch.empty_like(fused)
    tile = tiles.nms_tile  # [heads, tile] per program: the NMS window re-reads neighbours through the cache
    _nms_cross_head_kernel[(layers, triton.cdiv(n, tile))](
        fused, final, n, heads, radius, cfg.nms_alpha, 1.0 / cfg.cross_temperature, cfg.cross_alpha,
        math.log(cfg.eps), USE_NMS=cfg.use_nms, USE_CROSS=use_cross, BLOCK_H=triton.next_power_of_2(heads),
        BLOCK=tile, num_warps=tiles.nms_warps)
    return final

