"""The SFI Selector (SPEC section 5): attention evidence from a slow step -> which candidates to keep.

On a slow step, dense attention yields the logits of the R evidence rows (G query heads x W query rows)
of every KV head over the candidate range C = [lo, lo + n). The Selector turns them into the top-K
candidate positions per KV head, which the following fast steps attend to (with sinks and recent window):

    logits --pool_evidence--> log f --(fuse with log_prior, weight choose_lambda)--> log s
           --soft_nms--> --cross_head_exclusivity--> --top_k_positions--> absolute positions

Two ablations go beyond SPEC and are off by default: `evidence_norm = "visible"` softmaxes each
evidence row over every key it sees before restricting it to C (pool_evidence's `outside_lse`), and
`keep_neighbours = K` max-pools the final score over K positions just before the top-K
(keep_neighbours), so a kept peak brings its neighbours along.

Score tensors are `[..., H, n]`: any leading batch dims (layers, sequences), then the KV-head axis H,
then the n candidate positions. Everything runs in float32 log space, in plain PyTorch, on whatever
device the inputs live on, and is deterministic (ties go to the lower position).

A position that no evidence row may attend to gets f = 0, i.e. log f = -inf. Every stage keeps such a
-inf a -inf without producing NaN, so it ranks last unless the prior lifts it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sfibench.core.labels import label
from sfibench.sfi.selector_config import EVIDENCE_NORMS, SelectorConfig

NEG_INF = float("-inf")
def pool_evidence(logits: torch.Tensor, alpha: float, outside_lse: torch.Tensor | None = None) -> torch.Tensor:
    """Pool R attention rows into one distribution f over the candidates; returns log f `[..., H, n]`.

    Why: the G query heads sharing a KV head (and the W query rows at prefill) each vote for positions.
    A power mean with alpha < 1 sits between the mean (alpha = 1) and the geometric mean (alpha -> 0),
    so a position one row attends to strongly still counts, without letting a single row dominate.

    `logits` `[..., H, R, n]` are raw q.k/sqrt(d); each row is softmaxed over the n candidates, then
    f ∝ ((1/R) Σ_r p_r^alpha)^(1/alpha), normalised over n. A row may be -inf at positions it cannot
    attend to (causal masking of prefill rows). A row that is -inf everywhere sees no candidate and is
    ignored: R counts only the valid rows (the 1/R factor then cancels in the normalisation anyway).
    If no row is valid there is no evidence at all, and f is uniform.

    `outside_lse` `[..., H, R, 1]` (the --evidence-norm visible ablation): each row's log-sum-exp over the
    keys it sees outside C (sinks, recent window; -inf where there are none). Each row is then softmaxed
    over every key it sees and restricted to C, so a row that spends most of its attention outside C
    weighs less in the pool than one that attends inside C. With a single row this changes nothing:
    the final normalisation over C cancels the row's scale.
    """
    logits = logits.float()
    num_positions = logits.shape[-1]
    if num_positions == 0:
        return logits.new_empty(logits.shape[:-2] + (0,))
    valid_row = logits.amax(dim=-1, keepdim=True) > NEG_INF  # [..., H, R, 1]
    # Softmax a harmless zero row in place of an invalid one, then drop it from the sum.
    safe = torch.where(valid_row, logits, 0.0)
    log_p = torch.log_softmax(safe, dim=-1)
    if outside_lse is not None:  # scale each row by its share of the mass it puts on C
        inside_lse = torch.logsumexp(safe, dim=-1, keepdim=True)
        log_p = log_p + inside_lse - torch.logaddexp(inside_lse, outside_lse.float())
    log_p = torch.where(valid_row, log_p, NEG_INF)
    num_valid = valid_row.sum(dim=-2).float()  # [..., H, 1]
    # log of the power mean: (1/alpha) * (log Σ_r exp(alpha * log p_r) - log R)
    log_pooled = (torch.logsumexp(alpha * log_p, dim=-2) - num_valid.clamp_min(1).log()) / alpha
    log_f = torch.log_softmax(log_pooled, dim=-1)
    uniform = torch.full_like(log_f, -math.log(num_positions))
    return torch.where(num_valid > 0, log_f, uniform)


def log_prior(key_norms: torch.Tensor, cfg: SelectorConfig) -> torch.Tensor:
    """Prior r over the candidates from key norms and position; returns log r `[..., H, n]`.

    Why: large-norm keys produce spuriously large logits, and dense attention over-weights the most
    recent positions, so the prior prefers small-norm keys (-gamma log||k||) and older positions
    (-beta u^p + eta log(1 - u), u = relative position in [0, 1]). Logs are clamped at log(eps), so the
    newest candidate (u = 1) gets a finite penalty. Key norms are rotation-invariant, so pre- or
    post-RoPE keys give the same prior.
    """
    key_norms = key_norms.float()
    num_positions = key_norms.shape[-1]
    u = torch.arange(num_positions, device=key_norms.device, dtype=torch.float32) / max(num_positions - 1, 1)
    norm_term = -cfg.gamma * key_norms.clamp_min(cfg.eps).log()
    position_term = -cfg.beta * u.pow(cfg.pos_p) + cfg.eta * (1 - u).clamp_min(cfg.eps).log()
    return torch.log_softmax(cfg.w_norm * norm_term + cfg.w_pos * position_term, dim=-1)


def choose_lambda(
    log_f: torch.Tensor, log_r: torch.Tensor, num_rows: int, cfg: SelectorConfig
) -> torch.Tensor:
    """Weight of the prior in the fusion, per KV head; returns lambda `[..., H, 1]`.

    Why: lambda* = (Σf² - Σfr) / (Σf² - 2Σfr + Σr²) is the mixture on the segment from f to r with the
    smallest Σs², i.e. the most spread out: a sharply peaked f is hedged towards the prior, a flat one
    is not (lambda* <= 0 -> 0). The clip keeps the evidence dominant, more so when it pools several rows
    (`num_rows` = R = G x W, counted from the evidence shape, masked rows included).
    `cfg.lambda_fixed` (the --lambda ablation) replaces the closed form.
    """
    if cfg.lambda_fixed is not None:
        if not 0.0 <= cfg.lambda_fixed <= 1.0:
            raise ValueError(f"lambda_fixed must lie in [0, 1], got {cfg.lambda_fixed}")
        return torch.full_like(log_f[..., :1], cfg.lambda_fixed)
    f, r = log_f.exp(), log_r.float().exp()
    sum_ff = (f * f).sum(dim=-1, keepdim=True)
    sum_fr = (f * r).sum(dim=-1, keepdim=True)
    sum_rr = (r * r).sum(dim=-1, keepdim=True)
    lam = ((sum_ff - sum_fr) / (sum_ff - 2 * sum_fr + sum_rr).clamp_min(cfg.eps)).clamp_min(0.0)
    clip = cfg.lambda_clip_multi if num_rows > 1 else cfg.lambda_clip_single
    return lam.clamp_max(clip)


def fuse(log_f: torch.Tensor, log_r: torch.Tensor, lam: torch.Tensor, eps: float) -> torch.Tensor:
    """log s = log((1 - lambda) f + lambda r), the minimiser of (1-λ)KL(f‖s) + λKL(r‖s); `[..., H, n]`.

    Why log space: f spans many orders of magnitude, so mixing with logaddexp keeps tiny scores ranked.
    A weight <= eps drops its branch exactly (log weight = -inf), so lambda = 0 reproduces log f and
    lambda = 1 reproduces log r bit for bit.
    """
    lam = lam.float()
    log_weight_prior = torch.where(lam > eps, lam.log(), NEG_INF)
    log_weight_evidence = torch.where(1 - lam > eps, torch.log1p(-lam), NEG_INF)
    return torch.logaddexp(log_weight_evidence + log_f.float(), log_weight_prior + log_r.float())


def soft_nms(log_s: torch.Tensor, radius: int, alpha: float) -> torch.Tensor:
    """Soft non-maximum suppression along positions; returns log s' `[..., H, n]`.

    Why: attention mass comes in bursts of neighbouring tokens; without suppression the top-K spends
    its budget on the shoulders of a few peaks. Each position is pushed down by how far it sits below
    the best score within ±radius (the window truncated at the ends of C: nothing outside C counts):
    log s'(j) = log s(j) - alpha * max(0, m(j) - log s(j)). A local maximum is left unchanged.
    """
    log_s = log_s.float()
    num_positions = log_s.shape[-1]
    if num_positions == 0:
        return log_s
    radius = min(radius, num_positions - 1)  # a wider window sees nothing more, it only costs time
    flat = log_s.reshape(-1, 1, num_positions)
    # max_pool1d pads with -inf, which never wins a max: the window is exactly truncated at the edges.
    window_max = F.max_pool1d(flat, kernel_size=2 * radius + 1, stride=1, padding=radius).reshape(log_s.shape)
    suppressed = log_s - alpha * (window_max - log_s).clamp_min(0.0)
    return torch.where(torch.isneginf(log_s), log_s, suppressed)  # -inf - (-inf) would be NaN


def cross_head_exclusivity(log_s: torch.Tensor, temperature: float, alpha: float, eps: float) -> torch.Tensor:
    """Discourage KV heads of one layer from all spending their budget on the same positions; `[..., H, n]`.

    Why: a position every head wants adds little per head; one head cares about most is worth more to
    it. Per position, rho_h = softmax over heads of log s_h / T, and log s''_h = log s_h + alpha log
    max(rho_h, eps). The H axis is dim -2 and must hold all KV heads of one layer and sequence (on one
    tensor-parallel rank). With H <= 2 the stage is skipped (SPEC) and the input is returned as is.
    """
    if log_s.shape[-2] <= 2:
        return log_s
    log_s = log_s.float()
    log_rho = torch.log_softmax(log_s / temperature, dim=-2).clamp_min(math.log(eps))
    exclusive = log_s + alpha * log_rho
    return torch.where(torch.isneginf(log_s), log_s, exclusive)  # all heads -inf would give NaN


def keep_neighbours(log_s: torch.Tensor, kernel: int) -> torch.Tensor:
    """Max-pool the score over `kernel` neighbouring positions (an ablation beyond the paper); `[..., H, n]`.

    Why: on needle tasks the evidence peaks on the needle's key or its first value token, and Soft-NMS
    pushes down the tokens right after the peak, which hold the rest of the value. Giving every position
    the best score within ±kernel//2 (as SnapKV pools its votes) lets a kept peak bring those neighbours
    along. It runs last, just before the top-K: after Soft-NMS when that is on (peaks stay spread and
    each keeps its neighbours), in its place with --no-nms. Ties go to the lower position as in the top-K.
    The window is truncated at the ends of C; kernel 1 returns the scores unchanged.
    """
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"the neighbour-keeping kernel must be a positive odd number, got {kernel}")
    num_positions = log_s.shape[-1]
    if kernel == 1 or num_positions == 0:
        return log_s
    flat = log_s.float().reshape(-1, 1, num_positions)
    return F.max_pool1d(flat, kernel_size=kernel, stride=1, padding=kernel // 2).reshape(log_s.shape)


def top_k_positions(log_s: torch.Tensor, k: int, lo: int) -> torch.Tensor:
    """The min(k, n) best-scoring candidates per head as absolute positions, ascending; `[..., H, min(k, n)]`.

    Ties go to the lower position, deterministically on every device (torch.topk alone makes no such
    promise). Without sorting all n scores (at 128K candidates x 36 layers x 8 heads the sort was most
    of the Selector's time): one top-k finds the k-th best score; every score above it is kept, and of
    the scores equal to it the lowest positions fill what is left; a prefix count then puts each kept
    position at its rank, so the result comes out in ascending order.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    n = log_s.shape[-1]
    k = min(k, n)
    if k == 0:
        return torch.empty(log_s.shape[:-1] + (0,), dtype=torch.long, device=log_s.device)
    threshold = log_s.topk(k, dim=-1).values[..., -1:]
    above = log_s > threshold
    tied = log_s == threshold
    room = k - above.sum(dim=-1, keepdim=True)
    keep = above | (tied & (tied.cumsum(dim=-1) <= room))
    rank = torch.where(keep, keep.cumsum(dim=-1) - 1, k)  # dropped positions go to a spare column k
    positions = torch.arange(n, device=log_s.device).expand_as(log_s)
    out = torch.zeros(log_s.shape[:-1] + (k + 1,), dtype=torch.long, device=log_s.device)
    return out.scatter_(-1, rank, positions)[..., :k] + lo


def select(
    logits: torch.Tensor, key_norms: torch.Tensor, lo: int, k: int, cfg: SelectorConfig,
    outside_lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """The whole Selector: evidence logits `[..., H, R, n]` and key norms `[..., H, n]` of the candidates
    C = [lo, lo + n) -> LongTensor `[..., H, min(k, n)]` of selected absolute positions, ascending.

    Stages follow SPEC section 5 and are switched by `cfg.use_prior`, `cfg.use_nms`, `cfg.use_cross_head`
    (without the prior, s = f); `cfg.keep_neighbours` > 1 adds the neighbour-keeping pool before the top-K.
    `outside_lse` `[..., H, R, 1]` is required with `cfg.evidence_norm == "visible"` (see pool_evidence).
    """
    if cfg.evidence_norm not in EVIDENCE_NORMS:
        raise ValueError(f"unknown evidence_norm {cfg.evidence_norm!r}; valid: {', '.join(EVIDENCE_NORMS)}")
    if (outside_lse is not None) != (cfg.evidence_norm == "visible"):
        raise ValueError("outside_lse is given exactly when evidence_norm is 'visible'")
    num_rows, num_positions = logits.shape[-2], logits.shape[-1]
    if num_positions == 0:
        return torch.empty(logits.shape[:-2] + (0,), dtype=torch.long, device=logits.device)
    # Each stage carries a label so `sfibench profile` can split the Selector's time.
    with label("sfibench.selector.pool"):
        log_s = pool_evidence(logits, cfg.alpha, outside_lse)
    if cfg.use_prior:
        with label("sfibench.selector.prior_fusion"):
            log_r = log_prior(key_norms, cfg)
            lam = choose_lambda(log_s, log_r, num_rows, cfg)
            log_s = fuse(log_s, log_r, lam, cfg.eps)
    if cfg.use_nms:
        with label("sfibench.selector.nms"):
            log_s = soft_nms(log_s, cfg.nms_radius, cfg.nms_alpha)
    if cfg.use_cross_head:
        with label("sfibench.selector.cross_head"):
            log_s = cross_head_exclusivity(log_s, cfg.cross_temperature, cfg.cross_alpha, cfg.eps)
    with label("sfibench.selector.top_k"):  # the neighbour pool, when on, is counted with the top-K
        return top_k_positions(keep_neighbours(log_s, cfg.keep_neighbours), k, lo)
