"""The SFI Selector, stage by stage, against small hand calculations (plain `math`), plus invariants."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sfibench.sfi.config import SelectorConfig
from sfibench.sfi.method import visible_evidence
from sfibench.sfi.selector import (
    choose_lambda,
    cross_head_exclusivity,
    fuse,
    keep_neighbours,
    log_prior,
    pool_evidence,
    select,
    soft_nms,
    top_k_positions,
)

INF = float("inf")
ALL_OFF = SelectorConfig(use_prior=False, use_nms=False, use_cross_head=False)


def softmax(xs):
    exps = [math.exp(x) for x in xs]
    return [e / sum(exps) for e in exps]


def log_of(values):
    return torch.tensor([[math.log(v) if v > 0 else -INF for v in values]])


def assert_close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), atol=atol, rtol=1e-5)


# ---- 1. evidence pooling ---------------------------------------------------------------------------


def test_pool_evidence_power_mean_ignores_masked_row():
    row_a = softmax([0.0, 1.0, 2.0])
    row_b = softmax([2.0, 0.0]) + [0.0]  # causally masked at the last position
    pooled = [((math.sqrt(a) + math.sqrt(b)) / 2) ** 2 for a, b in zip(row_a, row_b)]
    expected = [[math.log(v / sum(pooled)) for v in pooled]]

    logits = torch.tensor([[[0.0, 1.0, 2.0], [2.0, 0.0, -INF], [-INF, -INF, -INF]]])  # H=1, R=3, n=3
    log_f = pool_evidence(logits, alpha=0.5)
    assert log_f.dtype == torch.float32 and log_f.shape == (1, 3)
    assert_close(log_f, expected)
    assert_close(pool_evidence(logits[:, :2], alpha=0.5), expected)  # the all -inf row changes nothing


def test_pool_evidence_alpha_one_is_mean_and_bf16_is_upcast():
    row_a, row_b = softmax([0.0, 1.0, 2.0]), softmax([1.0, -1.0, 0.5])
    expected = [[math.log((a + b) / 2) for a, b in zip(row_a, row_b)]]
    logits = torch.tensor([[[0.0, 1.0, 2.0], [1.0, -1.0, 0.5]]])
    assert_close(pool_evidence(logits, alpha=1.0), expected)
    assert pool_evidence(logits.bfloat16(), alpha=0.5).dtype == torch.float32


def test_pool_evidence_visible_norm_weighs_rows_by_their_mass_on_candidates():
    # Ablation --evidence-norm visible. Row a sees keys [sink, c0, c1, recent] with logits [2, 0, 1, 1];
    # row b sees only the candidates. Softmaxed over everything visible, row a keeps a small share on C.
    row_a = softmax([2.0, 0.0, 1.0, 1.0])[1:3]
    row_b = softmax([0.0, 1.0])
    pooled = [((math.sqrt(a) + math.sqrt(b)) / 2) ** 2 for a, b in zip(row_a, row_b)]
    expected = [[math.log(v / sum(pooled)) for v in pooled]]

    logits = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # H=1, R=2, n=2: both rows look alike on C
    outside = torch.tensor([[[math.log(math.exp(2.0) + math.exp(1.0))], [-INF]]])
    assert_close(pool_evidence(logits, 0.5, outside), expected)
    # Over the candidates alone the two rows are the same distribution, so the pool is that distribution.
    assert_close(pool_evidence(logits, 0.5), [[math.log(p) for p in row_b]])


def test_pool_evidence_visible_norm_changes_nothing_with_one_row():
    logits = torch.tensor([[[0.3, -1.0, 2.0]]])
    assert_close(pool_evidence(logits, 0.5, torch.tensor([[[4.0]]])), pool_evidence(logits, 0.5))


def test_visible_evidence_splits_candidates_from_the_rest():
    row = torch.tensor([[[1.0, 2.0, 0.5, -1.0, 3.0, -INF]]])  # C = [2, 4); position 5 is masked
    logits, outside = visible_evidence(row, 2, 4)
    assert torch.equal(logits, row[..., 2:4])
    assert_close(outside, [[[math.log(math.exp(1.0) + math.exp(2.0) + math.exp(3.0))]]])
    _, nothing_outside = visible_evidence(row[..., :5], 0, 4)  # the one outside key is visible
    assert_close(nothing_outside, [[[3.0]]])


def test_pool_evidence_without_any_valid_row_is_uniform():
    logits = torch.full((2, 1, 3, 4), -INF)
    assert_close(pool_evidence(logits, alpha=0.5), torch.full((2, 1, 4), -math.log(4)))


# ---- 2. prior --------------------------------------------------------------------------------------


def test_log_prior_hand_values():
    cfg = SelectorConfig()
    norms, u = [1.0, 2.0, 4.0], [0.0, 0.5, 1.0]
    raw = [
        -0.5 * math.log(k) + 0.7 * (-cfg.beta * x**1.8 + 0.4 * math.log(max(1 - x, 1e-12)))
        for k, x in zip(norms, u)
    ]
    log_z = math.log(sum(math.exp(v) for v in raw))
    log_r = log_prior(torch.tensor([norms]), cfg)
    assert_close(log_r, [[v - log_z for v in raw]])
    assert torch.isfinite(log_r).all()  # u = 1 is clamped, not -inf
    assert_close(log_prior(torch.tensor([[3.0]]), cfg), [[0.0]])  # one candidate: u = 0


# ---- 3. fusion weight and fusion ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("f", "r", "lambda_star"),
    [
        ([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 0.09 / 0.18),  # above both clips
        ([0.3, 0.3, 0.4], [0.6, 0.2, 0.2], 0.02 / 0.14),  # below both clips
        ([0.2, 0.3, 0.5], [0.1, 0.3, 0.6], 0.0),  # negative, clamped to 0
        ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5], 0.0),  # f == r: zero denominator
    ],
)
def test_choose_lambda_closed_form_and_clip(f, r, lambda_star):
    cfg = SelectorConfig()
    log_f, log_r = log_of(f), log_of(r)
    assert_close(choose_lambda(log_f, log_r, 4, cfg), [[min(lambda_star, 0.25)]])
    assert_close(choose_lambda(log_f, log_r, 1, cfg), [[min(lambda_star, 0.35)]])


def test_choose_lambda_fixed_overrides_closed_form():
    cfg = SelectorConfig(lambda_fixed=0.6)
    log_f, log_r = log_of([0.5, 0.3, 0.2]), log_of([0.2, 0.3, 0.5])
    assert_close(choose_lambda(log_f, log_r, 4, cfg), [[0.6]])
    assert_close(choose_lambda(log_f, log_r, 1, cfg), [[0.6]])
    with pytest.raises(ValueError):
        choose_lambda(log_f, log_r, 1, SelectorConfig(lambda_fixed=1.5))


def test_fuse_is_log_of_mixture_including_endpoints():
    f, r = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    log_f, log_r = log_of(f), log_of(r)
    assert_close(fuse(log_f, log_r, torch.tensor([[0.25]]), 1e-12), log_of([0.425, 0.3, 0.275]))
    assert torch.equal(fuse(log_f, log_r, torch.tensor([[0.0]]), 1e-12), log_f)
    assert torch.equal(fuse(log_f, log_r, torch.tensor([[1.0]]), 1e-12), log_r)
    # A zero in f stays -inf at lambda = 0 (no NaN) and becomes lambda * r otherwise; lambda is per head.
    two_heads = fuse(
        log_of([0.6, 0.4, 0.0]).expand(2, 3), log_r.expand(2, 3), torch.tensor([[0.0], [0.5]]), 1e-12
    )
    assert_close(two_heads, torch.cat([log_of([0.6, 0.4, 0.0]), log_of([0.4, 0.35, 0.25])]))


# ---- 4. soft-NMS ---------------------------------------------------------------------------------------


def test_soft_nms_window_is_truncated_at_both_edges():
    # Peaks at 0 and n-1. All scores are negative, so any padding leaking in as 0 would show.
    log_s = torch.tensor([[[-1.0, -5.0, -6.0, -6.0, -4.0, -0.5]]])
    # window maxima m = [-1, -1, -5, -4, -0.5, -0.5]; s' = s - (m - s)
    assert_close(soft_nms(log_s, radius=1, alpha=1.0), [[[-1.0, -9.0, -7.0, -8.0, -7.5, -0.5]]])
    assert_close(soft_nms(log_s, radius=1, alpha=0.5), [[[-1.0, -7.0, -6.5, -7.0, -5.75, -0.5]]])
    assert torch.equal(soft_nms(log_s, radius=0, alpha=1.0), log_s)


def test_soft_nms_radius_larger_than_range():
    log_s = torch.tensor([[-3.0, -1.0, -2.0, -4.0]])  # the window covers everything: m = -1
    assert_close(soft_nms(log_s, radius=10, alpha=1.0), [[-5.0, -1.0, -3.0, -7.0]])


def test_soft_nms_keeps_minus_inf_without_nan():
    log_s = torch.tensor([[-INF, 0.0, -INF], [-INF, -INF, -INF]])
    out = soft_nms(log_s, radius=1, alpha=1.0)
    assert not out.isnan().any()
    assert torch.equal(out, log_s)


# ---- 5. cross-head exclusivity -----------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", [1, 2])
def test_cross_head_skipped_at_two_heads_or_fewer(num_heads):
    log_s = torch.randn(3, num_heads, 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cross_head_exclusivity(log_s, 2.0, 0.85, 1e-12), log_s)


def test_cross_head_hand_values_at_three_heads():
    log_s = [[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]  # [H=3, n=2]
    expected = [[0.0, 0.0] for _ in range(3)]
    for j in range(2):
        rho = softmax([log_s[h][j] / 2.0 for h in range(3)])
        for h in range(3):
            expected[h][j] = log_s[h][j] + 0.85 * math.log(max(rho[h], 1e-12))
    assert_close(cross_head_exclusivity(torch.tensor(log_s), 2.0, 0.85, 1e-12), expected)


def test_cross_head_clamps_rho_at_eps_and_keeps_minus_inf():
    log_s = torch.tensor([[0.0, -INF], [100.0, -INF], [100.0, -INF]])  # rho_0 ~ 1e-44 at position 0
    out = cross_head_exclusivity(log_s, 1.0, 0.85, 1e-12)
    assert_close(
        out[:, :1], [[0.85 * math.log(1e-12)], [100 + 0.85 * math.log(0.5)], [100 + 0.85 * math.log(0.5)]]
    )
    assert torch.equal(out[:, 1], log_s[:, 1])  # every head -inf: stays -inf, no NaN


# ---- neighbour-keeping (an ablation beyond the paper) ------------------------------------------------


def test_keep_neighbours_pools_the_best_score_within_half_the_kernel():
    log_s = torch.tensor([[0.0, -5.0, -1.0, -9.0, -9.0, -3.0, -INF]])
    assert_close(keep_neighbours(log_s, 3), [[0.0, 0.0, -1.0, -1.0, -3.0, -3.0, -3.0]])
    assert_close(keep_neighbours(log_s, 5), [[0.0, 0.0, 0.0, -1.0, -1.0, -3.0, -3.0]])  # truncated at the ends
    assert torch.equal(keep_neighbours(log_s, 1), log_s)
    with pytest.raises(ValueError, match="positive odd number"):
        keep_neighbours(log_s, 4)


def test_select_keep_neighbours_brings_back_what_nms_pushed_down():
    logits = torch.zeros(1, 1, 10)
    logits[0, 0, 3], logits[0, 0, 4], logits[0, 0, 8] = 5.0, 3.5, 3.0  # a peak with a shoulder at 4
    norms = torch.ones(1, 10)
    nms_on = dataclasses.replace(ALL_OFF, use_nms=True, nms_radius=1)
    assert select(logits, norms, 0, 3, nms_on).tolist() == [[3, 4, 8]]
    # After NMS the peak at 3 lends its score to 2 and 4: the whole neighbourhood ranks first.
    assert select(logits, norms, 0, 3, dataclasses.replace(nms_on, keep_neighbours=3)).tolist() == [[2, 3, 4]]
    # In place of NMS (--no-nms) it does the same here, from the raw evidence.
    assert select(logits, norms, 0, 3, dataclasses.replace(ALL_OFF, keep_neighbours=3)).tolist() == [[2, 3, 4]]


def test_select_uses_the_nms_radius_and_alpha_settings():
    logits = torch.zeros(1, 1, 10)
    logits[0, 0, 3], logits[0, 0, 5], logits[0, 0, 9] = 5.0, 4.0, 1.0  # peaks two apart, a bump far off
    norms = torch.ones(1, 10)
    nms_on = dataclasses.replace(ALL_OFF, use_nms=True, nms_alpha=4.0)
    assert select(logits, norms, 0, 2, dataclasses.replace(nms_on, nms_radius=1)).tolist() == [[3, 5]]
    # Within radius 2, position 5 sees the higher peak at 3: 4 - 4 * (5 - 4) = 0 < 1, so 9 wins.
    assert select(logits, norms, 0, 2, dataclasses.replace(nms_on, nms_radius=2)).tolist() == [[3, 9]]
    assert select(logits, norms, 0, 2, dataclasses.replace(nms_on, nms_radius=2, nms_alpha=0.0)).tolist() == [[3, 5]]


def test_select_asks_for_outside_mass_exactly_with_visible_norm():
    logits, norms = torch.zeros(1, 1, 4), torch.ones(1, 4)
    visible = dataclasses.replace(ALL_OFF, evidence_norm="visible")
    with pytest.raises(ValueError, match="outside_lse"):
        select(logits, norms, 0, 2, visible)
    with pytest.raises(ValueError, match="outside_lse"):
        select(logits, norms, 0, 2, ALL_OFF, torch.zeros(1, 1, 1))
    with pytest.raises(ValueError, match="unknown evidence_norm 'all'"):
        select(logits, norms, 0, 2, dataclasses.replace(ALL_OFF, evidence_norm="all"))
    assert select(logits, norms, 0, 2, visible, torch.zeros(1, 1, 1)).tolist() == [[0, 1]]


# ---- 6. top-K ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "expected"), [(2, [11, 12]), (3, [11, 12, 14]), (4, [11, 12, 13, 14])])
def test_top_k_ties_go_to_lower_position(k, expected):
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    assert top_k_positions(scores, k, lo=10).tolist() == [expected]


def test_top_k_many_ties_match_python_ordering():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 4, (3, 500), generator=gen).float()
    scores[:, 100:200] = -INF
    for head in range(3):
        values = scores[head].tolist()
        ranked = sorted(range(500), key=lambda j: (-values[j], j))
        expected = sorted(j + 7 for j in ranked[:37])
        assert top_k_positions(scores[head : head + 1], 37, lo=7).tolist() == [expected]


def test_top_k_shorter_range_than_k_returns_all():
    scores = torch.randn(2, 3, 5)
    out = top_k_positions(scores, 64, lo=4)
    assert out.dtype == torch.long and out.shape == (2, 3, 5)
    assert (out == torch.arange(4, 9)).all()


# ---- the whole pipeline --------------------------------------------------------------------------------


def random_inputs(seed, batch=(2, 3), heads=4, rows=5, n=40, causal=False):
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(*batch, heads, rows, n, generator=gen)
    if causal:  # row r sees positions [0, n - rows + r], like the last prompt rows at prefill
        visible = torch.arange(n) <= (n - rows + torch.arange(rows))[:, None]
        logits = logits.masked_fill(~visible, -INF)
    key_norms = 1 + 10 * torch.rand(*batch, heads, n, generator=gen)
    return logits, key_norms


def test_select_empty_range_and_short_range():
    logits, norms = random_inputs(0, n=6)
    assert select(logits[..., :0], norms[..., :0], 4, 16, SelectorConfig()).shape == (2, 3, 4, 0)
    out = select(logits, norms, 4, 16, SelectorConfig())
    assert out.shape == (2, 3, 4, 6) and (out == torch.arange(4, 10)).all()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("n", "k"), [(1, 4), (7, 3), (40, 16), (300, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_select_invariants_on_random_inputs(seed, n, k, causal):
    logits, norms = random_inputs(seed, n=n, causal=causal and n > 5)
    logits[0, 0, 0, 1] = -INF  # one evidence row that sees nothing
    lo = 4
    out = select(logits, norms, lo, k, SelectorConfig())
    assert out.dtype == torch.long and out.shape == (2, 3, 4, min(k, n))
    assert ((out >= lo) & (out < lo + n)).all()
    assert (out[..., 1:] > out[..., :-1]).all()  # ascending, hence distinct
    assert torch.equal(out, select(logits, norms, lo, k, SelectorConfig()))


def test_select_with_all_stages_off_is_top_k_of_evidence():
    logits, norms = random_inputs(3, n=100)
    expected = top_k_positions(pool_evidence(logits, 0.5), 10, 20)
    assert torch.equal(select(logits, norms, 20, 10, ALL_OFF), expected)
    prior_at_zero = dataclasses.replace(ALL_OFF, use_prior=True, lambda_fixed=0.0)
    assert torch.equal(select(logits, norms, 20, 10, prior_at_zero), expected)


def test_select_prior_changes_choice_on_flat_evidence():
    logits, norms = random_inputs(4, n=50)
    logits = torch.zeros_like(logits)  # flat evidence: without the prior, ties give the first K
    assert (select(logits, norms, 0, 8, ALL_OFF) == torch.arange(8)).all()
    with_prior = dataclasses.replace(ALL_OFF, use_prior=True, lambda_fixed=0.3)
    expected = top_k_positions(log_prior(norms, with_prior), 8, 0)
    out = select(logits, norms, 0, 8, with_prior)
    assert torch.equal(out, expected) and not (out == torch.arange(8)).all()


def test_select_nms_spreads_the_selection():
    logits = torch.zeros(1, 1, 10)
    logits[0, 0, 3], logits[0, 0, 4], logits[0, 0, 8] = 5.0, 3.5, 3.0  # a peak with a shoulder at 4
    norms = torch.ones(1, 10)
    assert select(logits, norms, 0, 2, ALL_OFF).tolist() == [[3, 4]]
    nms_on = dataclasses.replace(ALL_OFF, use_nms=True, nms_radius=1)
    assert select(logits, norms, 0, 2, nms_on).tolist() == [[3, 8]]  # 4 drops to 3.5 - 1.5 = 2 < 3


def test_select_cross_head_moves_a_head_off_shared_positions():
    logits = torch.tensor([[[0.0, 0.1]], [[-10.0, 5.0]], [[-10.0, 5.0]]])  # heads 1, 2 crowd position 1
    norms = torch.ones(3, 2)
    cross_on = dataclasses.replace(ALL_OFF, use_cross_head=True)
    assert select(logits, norms, 0, 1, ALL_OFF).tolist() == [[1], [1], [1]]
    assert select(logits, norms, 0, 1, cross_on).tolist() == [[0], [1], [1]]
    assert torch.equal(
        select(logits[:2], norms[:2], 0, 1, cross_on), select(logits[:2], norms[:2], 0, 1, ALL_OFF)
    )
