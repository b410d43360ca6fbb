"""The top-K kernels (optimized/top_k_kernels.py: the radix select, and `top_k`'s split ranking, its one
program per row and its hand-over to the radix select) against sfi/selector.top_k_positions.

Under TRITON_INTERPRET without CUDA (tests/conftest.py). The oracle is the PyTorch top-K: the same
positions, in the same ascending order, whatever the ties. Scores cover what the Selector can hand it:
runs of exact ties (straddling chunk boundaries), -inf, -0.0 next to +0.0, negatives and positives that
share their top key bytes, K at and above n, and more than one chunk per head. The split ranking is forced
to a few chunks on these small rows (its default would rank most of them in one program), so its merge of
the chunks' candidates is what is checked.
"""

from __future__ import annotations

import pytest
import torch

from sfibench.optimized.top_k_kernels import (
    CHUNK_TILES,
    MERGE_MAX,
    ROW_BLOCK_MAX,
    TILE,
    radix_top_k,
    ranking_splits,
    top_k,
)
from sfibench.sfi.selector import top_k_positions

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def scores(rows: int, n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, n, generator=generator).to(DEVICE)


def split_in_three(scores, k, lo):
    return top_k(scores, k, lo, num_splits=3)


def one_program_per_row(scores, k, lo):
    return top_k(scores, k, lo, num_splits=1)


RANKERS = [split_in_three, top_k, radix_top_k, one_program_per_row]


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


@pytest.mark.parametrize("splits", [2, 5, 7])
def test_split_ranking_of_page_rows_keeps_the_one_pass_answer(splits):
    """Quest's rows: [B, H_kv, pages] with -inf from each sequence's current page on (rows of other lengths),
    many exact ties (scores on a coarse grid, so ties straddle the chunks and the K-th best is tied), and K
    below, at and above the real pages of a row; each split count merges chunks of another size, the last
    one short."""
    batch, kv_heads, pages = 3, 2, 97
    generator = torch.Generator().manual_seed(splits)
    s = torch.randint(-6, 7, (batch, kv_heads, pages), generator=generator).float().div(4).to(DEVICE)
    current = torch.tensor([97, 40, 3], device=DEVICE)  # pages before each sequence's current page
    s = s.masked_fill(~(torch.arange(pages, device=DEVICE) < current[:, None])[:, None], float("-inf"))
    for k in (1, 9, 40, 143):
        want = top_k_positions(s, k, lo=0)
        assert torch.equal(top_k(s, k, 0, num_splits=splits), want)
        real = want < current[:, None, None]  # the real pages come first, ascending
        assert torch.equal(real, real.sort(dim=-1, descending=True).values)


def test_split_counts_fill_the_gpu_where_the_chunks_cut_the_rows_down():
    """At the qwen3-4b shape (8 KV heads) on 132 SMs: Quest's 8K pages (128K tokens) rank in 16 chunks a row
    at B = 1 and 5 at B = 6, as the dense decode kernel splits those rows; a row too short for chunks of 2K
    scores, or TidalDecode's K = 2,307 tokens, is not split (one program, or the radix select)."""
    assert ranking_splits(8, 8200, 143, 132) == 16
    assert ranking_splits(48, 8200, 143, 132) == 5
    assert ranking_splits(8, 520, 143, 132) == 1
    assert ranking_splits(8, 131080, 2307, 132) == 1
    assert all(ranking_splits(rows, n, 143, 132) * 143 <= MERGE_MAX for rows in (1, 8, 48) for n in (2056, 8200))
    with pytest.raises(ValueError, match="num_splits"):
        top_k(scores(2, 50, seed=0), 5, 0, num_splits=0)
