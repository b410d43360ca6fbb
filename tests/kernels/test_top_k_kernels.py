"""The top-K kernels (optimized/top_k_kernels.py: the radix select and the one-program-per-row `top_k`,
which hands longer rows to the radix select) against sfi/selector.top_k_positions.

Under TRITON_INTERPRET without CUDA (tests/conftest.py). The oracle is the PyTorch top-K: the same
positions, in the same ascending order, whatever the ties. Scores cover what the Selector can hand it:
runs of exact ties (straddling chunk boundaries), -inf, -0.0 next to +0.0, negatives and positives that
share their top key bytes, K at and above n, and more than one chunk per head.
"""

from __future__ import annotations

import pytest
import torch

from sfibench.optimized.top_k_kernels import CHUNK_TILES, ROW_BLOCK_MAX, TILE, radix_top_k, top_k
from sfibench.sfi.selector import top_k_positions

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def scores(rows: int, n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, n, generator=generator).to(DEVICE)


RANKERS = [radix_top_k, top_k]


@pytest.mark.parametrize("rank", RANKERS)
@pytest.mark.parametrize("n, k", [(2500, 40), (700, 700), (300, 500), (TILE * CHUNK_TILES + 900, 2048),
                                  (ROW_BLOCK_MAX, 143)])
def test_positions_match_torch_top_k(rank, n, k):
    s = scores(4, n, seed=n)
    assert torch.equal(rank(s, k, lo=7), top_k_positions(s, k, lo=7))


@pytest.mark.parametrize("rank", RANKERS)
@pytest.mark.parametrize("n", [2 * TILE * CHUNK_TILES + 5, 3000])  # three radix chunks; one row program
def test_ties_go_to_the_lowest_positions(rank, n):
    s = scores(3, n, seed=1)
    s[0, :] = 0.25  # everything tied: the K lowest positions
    s[1, n // 4:n // 4 * 3] = 1.5  # a tie run larger than K at the top (crossing the radix chunk boundary)
    s[2, ::2] = -0.0  # -0.0 and +0.0 are equal scores, one tie
    s[2, 1::4] = 0.0
    for k in (1, 333, 4000):
        assert torch.equal(rank(s, k, lo=0), top_k_positions(s, k, lo=0))
    assert rank(s, 3, lo=0)[0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("rank", RANKERS)
def test_minus_infinity_and_keys_sharing_their_top_bytes(rank):
    s = scores(2, 3000, seed=2)
    s[0, 100:] = float("-inf")  # fewer finite scores than K: the lowest -inf positions fill it
    s[1] = torch.linspace(-1e-30, 1e-30, 3000)  # tiny values of both signs: keys differ in low bytes only
    s[1, 17] = s[1, 2900] = float("inf")
    for k in (64, 200, 3000):
        assert torch.equal(rank(s, k, lo=3), top_k_positions(s, k, lo=3))


@pytest.mark.parametrize("rank", RANKERS)
def test_leading_dims_and_empty_results(rank):
    s = scores(6, 500, seed=3).view(2, 3, 500)
    out = rank(s, 20, lo=11)
    assert out.shape == (2, 3, 20) and torch.equal(out, top_k_positions(s, 20, lo=11))
    assert rank(s, 0, lo=0).shape == (2, 3, 0)
    with pytest.raises(ValueError, match="float32"):
        rank(s.double(), 5, lo=0)
