"""The Triton Selector (optimized/selector_kernels.py, with optimized/sfi.py's fused_select around it) against
the PyTorch one (sfi/selector.py).

Without CUDA the kernels run in the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET). The
torch Selector is the oracle: its scores stage by stage, and `select`'s positions. Shapes cross the
kernels' tile (1,024) and chunk (8,192) sizes, and the evidence includes causally masked rows, rows
masked everywhere, views with a layer stride, and exact ties.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sfibench.optimized.selector_kernels import SelectorTiles, fused_scores
from sfibench.optimized.sfi import fused_select, score_params
from sfibench.optimized.top_k_kernels import radix_top_k
from sfibench.sfi.config import SelectorConfig
from sfibench.sfi.selector import (
    choose_lambda,
    cross_head_exclusivity,
    fuse,
    log_prior,
    pool_evidence,
    select,
    soft_nms,
    top_k_positions,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DEFAULT = SelectorConfig()
CONFIGS = {
    "spec": DEFAULT,
    "no prior": dataclasses.replace(DEFAULT, use_prior=False),
    "no nms": dataclasses.replace(DEFAULT, use_nms=False),
    "no cross-head": dataclasses.replace(DEFAULT, use_cross_head=False),
    "fixed lambda": dataclasses.replace(DEFAULT, lambda_fixed=0.3),
    "narrow nms": dataclasses.replace(DEFAULT, nms_radius=2, nms_alpha=0.5),
    "keep neighbours": dataclasses.replace(DEFAULT, keep_neighbours=5),
}


def torch_scores(logits: torch.Tensor, key_norms: torch.Tensor, cfg: SelectorConfig) -> torch.Tensor:
    """What `select` ranks, stage by stage (before the neighbour pool and the top-K)."""
    log_s = pool_evidence(logits, cfg.alpha)
    if cfg.use_prior:
        log_r = log_prior(key_norms, cfg)
        log_s = fuse(log_s, log_r, choose_lambda(log_s, log_r, logits.shape[-2], cfg), cfg.eps)
    if cfg.use_nms:
        log_s = soft_nms(log_s, cfg.nms_radius, cfg.nms_alpha)
    if cfg.use_cross_head:
        log_s = cross_head_exclusivity(log_s, cfg.cross_temperature, cfg.cross_alpha, cfg.eps)
    return log_s


def evidence(layers: int, heads: int, rows: int, n: int, seed: int, causal: bool = False):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(layers, heads, rows, n, generator=generator) * 3
    norms = torch.rand(layers, heads, n, generator=generator) * 5 + 0.05
    if causal:  # prefill rows: row r sees the first n - (rows - 1 - r) * 7 candidates only
        visible = torch.arange(n)[None, :] < (n - 7 * torch.arange(rows - 1, -1, -1))[:, None]
        logits = logits.masked_fill(~visible, float("-inf"))
    return logits.to(DEVICE), norms.to(DEVICE)


def assert_scores_match(logits, norms, cfg):
    expected, actual = torch_scores(logits, norms, cfg), fused_scores(logits, norms, score_params(cfg))
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected))
    finite = ~torch.isneginf(expected)
    torch.testing.assert_close(actual[finite], expected[finite], atol=2e-4, rtol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_scores_and_positions_match_torch_selector(name):
    cfg = CONFIGS[name]
    logits, norms = evidence(2, 4, 3, 1500, seed=len(name))
    if not cfg.keep_neighbours > 1:
        assert_scores_match(logits, norms, cfg)
    assert torch.equal(fused_select(logits, norms, 17, 100, cfg), select(logits, norms, 17, 100, cfg))


def test_many_chunks_and_a_ragged_last_tile():
    logits, norms = evidence(1, 3, 2, 9000, seed=3)  # two 8K chunks, the last tile 808 wide
    assert_scores_match(logits, norms, DEFAULT)
    assert torch.equal(fused_select(logits, norms, 0, 700, DEFAULT), select(logits, norms, 0, 700, DEFAULT))


def test_causally_masked_rows_and_a_row_masked_everywhere():
    logits, norms = evidence(2, 4, 5, 600, seed=4, causal=True)
    logits[1, 2, 0] = float("-inf")  # one row sees nothing: left out of the pool
    logits[0, 1] = float("-inf")  # a head whose rows all see nothing: uniform evidence, the prior decides
    assert_scores_match(logits, norms, DEFAULT)
    assert torch.equal(fused_select(logits, norms, 5, 64, DEFAULT), select(logits, norms, 5, 64, DEFAULT))


def test_two_heads_skip_the_cross_head_stage():
    logits, norms = evidence(1, 2, 4, 400, seed=5)
    assert_scores_match(logits, norms, DEFAULT)
    assert torch.equal(fused_select(logits, norms, 0, 30, DEFAULT), select(logits, norms, 0, 30, DEFAULT))


def test_strided_evidence_view_reads_the_right_layers():
    """The optimized path passes every other layer of its evidence buffer as a view, not a copy."""
    logits, norms = evidence(4, 4, 2, 700, seed=6)
    view, view_norms = logits[1::2], norms[1::2]
    assert not view.is_contiguous()
    expected = select(view.contiguous(), view_norms.contiguous(), 3, 50, DEFAULT)
    assert torch.equal(fused_select(view, view_norms, 3, 50, DEFAULT), expected)


def test_top_k_ties_go_to_the_lowest_positions():
    scores = torch.zeros(2, 3, 2500, device=DEVICE)
    scores[0, 1, 2000] = 1.0  # one clear winner, the rest of its K from the lowest tied positions
    scores[1, 2, :] = float("-inf")  # nothing is finite: the lowest positions
    out = radix_top_k(scores, 40, lo=9)
    assert torch.equal(out, top_k_positions(scores, 40, lo=9))
    assert out[0, 1, -1].item() == 2009 and out[0, 0, 0].item() == 9
    assert torch.equal(radix_top_k(scores, 5000, lo=0), top_k_positions(scores, 5000, lo=0))  # K > n: all


def test_ablations_outside_the_kernels_go_to_the_torch_selector():
    logits, norms = evidence(1, 4, 2, 300, seed=7)
    outside = torch.randn(1, 4, 2, 1, device=DEVICE)
    visible = dataclasses.replace(DEFAULT, evidence_norm="visible")
    assert torch.equal(fused_select(logits, norms, 0, 20, visible, outside),
                       select(logits, norms, 0, 20, visible, outside))


def test_other_tile_shapes_give_the_same_scores():
    """bench_fast_path --selector-tiles times other launch shapes: they must rank the same scores. n = 700
    leaves a partial last tile and chunk under every shape here."""
    logits, norms = evidence(2, 4, 3, 700, seed=11)
    expected = fused_scores(logits, norms, score_params(DEFAULT))
    shapes = (SelectorTiles(block=128, chunk_blocks=1, nms_tile=64),
              SelectorTiles(block=256, chunk_blocks=3, pool_warps=8, nms_warps=8),
              SelectorTiles(stream_block=64, block=1024, chunk_blocks=1))
    for tiles in shapes:
        torch.testing.assert_close(fused_scores(logits, norms, score_params(DEFAULT), tiles), expected,
                                   atol=1e-5, rtol=1e-6)
    with pytest.raises(ValueError, match="power of two"):
        SelectorTiles(block=1000)
    with pytest.raises(ValueError, match="chunk_blocks"):
        SelectorTiles(chunk_blocks=0)


@pytest.mark.parametrize("n, radius", [(700, 16), (333, 3), (40, 16), (17, 30)])
def test_soft_nms_windows_cut_by_the_ends_of_the_candidates(n, radius):
    """Soft-NMS tiles near an end of C load their windows with edge masks, the others without: against the
    PyTorch stages with masked candidates, radii whose window is not a power of two, and radii reaching
    past both ends (n = 40 with r = 16 leaves no interior tile; n = 17 < r)."""
    logits, norms = evidence(2, 4, 3, n, seed=n + radius)
    logits[0, 1, :, : n // 5] = float("-inf")
    cfg = dataclasses.replace(DEFAULT, nms_radius=radius)
    torch.testing.assert_close(fused_scores(logits, norms, score_params(cfg), SelectorTiles(nms_tile=64)),
                               torch_scores(logits, norms, cfg), atol=1e-4, rtol=1e-5)


def test_bad_input_is_refused():
    logits, norms = evidence(1, 4, 2, 300, seed=8)
    with pytest.raises(ValueError, match="key_norms must be"):
        fused_scores(logits, norms[:, :2], score_params(DEFAULT))
    with pytest.raises(ValueError, match="float32"):
        fused_scores(logits.half(), norms, score_params(DEFAULT))
