"""The retrieval methods' kernels against their torch references, under TRITON_INTERPRET=1 on a CPU."""

from __future__ import annotations

import pytest
import torch

from sfibench.optimized.retrieval_kernels import (
    expand_positions,
    expand_positions_reference,
    page_scores,
    page_scores_reference,
    token_scores,
    token_scores_reference,
)
from sfibench.optimized.top_k_kernels import radix_top_k

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def keys_and_bounds(batch, kv_heads, slots, dim, page, lengths, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, kv_heads, slots, dim, generator=generator).to(DEVICE, dtype)
    pages = -(-slots // page)
    padded = torch.nn.functional.pad(keys.float(), (0, 0, 0, pages * page - slots)).view(batch, kv_heads, pages,
                                                                                          page, dim)
    # bounds as prefill leaves them for lengths - 1 tokens (this step's key, at lengths - 1, not yet folded in)
    valid = (torch.arange(pages * page, device=DEVICE) < (lengths - 1)[:, None]).view(batch, 1, pages, page, 1)
    highest = padded.masked_fill(~valid, -1e4).amax(dim=3).to(dtype)
    lowest = padded.masked_fill(~valid, 1e4).amin(dim=3).to(dtype)
    return keys, highest, lowest


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [[37, 64], [65, 1], [130, 17]])
def test_page_scores_match_the_reference_and_fold_the_new_key(dtype, lengths):
    batch, kv_heads, group, dim, page, slots = 2, 2, 3, 16, 16, 130
    lengths = torch.tensor(lengths, device=DEVICE)
    keys, highest, lowest = keys_and_bounds(batch, kv_heads, slots, dim, page, lengths, dtype, seed=1)
    q = torch.randn(batch, kv_heads * group, dim, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    want_high, want_low = highest.clone(), lowest.clone()
    want = page_scores_reference(q, want_high, want_low, keys, lengths, page)
    got = page_scores(q, highest, lowest, keys, lengths, page)
    assert torch.equal(highest, want_high) and torch.equal(lowest, want_low)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("block_pages", [4, 128])
def test_page_scores_under_other_launch_shapes_match_the_reference(block_pages):
    """bench_retrieval --page-tiles times other pages-per-program: the current page's fold must land in
    whichever program holds it (4 pages a program: the newest keys, at slots 36 and 64, are in pages 2 and 4,
    so in the first and the second program)."""
    batch, kv_heads, group, dim, page, slots = 2, 2, 4, 16, 16, 130
    lengths = torch.tensor([37, 65], device=DEVICE)
    keys, highest, lowest = keys_and_bounds(batch, kv_heads, slots, dim, page, lengths, torch.float32, seed=7)
    q = torch.randn(batch, kv_heads * group, dim, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    want_high, want_low = highest.clone(), lowest.clone()
    want = page_scores_reference(q, want_high, want_low, keys, lengths, page)
    got = page_scores(q, highest, lowest, keys, lengths, page, block_pages=block_pages, num_warps=8)
    assert torch.equal(highest, want_high) and torch.equal(lowest, want_low)
    assert torch.equal(torch.isfinite(want), torch.isfinite(got))
    torch.testing.assert_close(got[torch.isfinite(want)], want[torch.isfinite(want)], rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="power of two"):
        page_scores(q, highest, lowest, keys, lengths, page, block_pages=48)


def test_page_scores_reference_is_the_per_head_maximum_of_the_bound_products():
    """The reference scores with two products per KV head (sum_g q_g+ . M, sum_g q_g- . m); that is Quest's
    bound as written, sum_g sum_i max(q_gi M_i, q_gi m_i), for every page before the current one."""
    batch, kv_heads, group, dim, page, slots = 2, 3, 4, 16, 8, 100
    lengths = torch.tensor([100, 43], device=DEVICE)
    keys, highest, lowest = keys_and_bounds(batch, kv_heads, slots, dim, page, lengths, torch.float32, seed=4)
    q = torch.randn(batch, kv_heads * group, dim, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    scores = page_scores_reference(q, highest, lowest, keys, lengths, page)  # folds the new key into its page
    grouped = q.view(batch, kv_heads, group, 1, dim)
    literal = torch.maximum(grouped * highest[:, :, None], grouped * lowest[:, :, None]).sum(dim=(2, 4))
    before = torch.arange(highest.shape[2], device=DEVICE)[None, :] < ((lengths - 1) // page)[:, None]
    torch.testing.assert_close(scores[before[:, None].expand_as(scores)],
                               literal[before[:, None].expand_as(literal)], rtol=1e-5, atol=1e-4)
    assert torch.isneginf(scores[~before[:, None].expand_as(scores)]).all()


def test_a_pages_bound_is_never_below_the_score_of_its_keys():
    """Quest's premise: the page holding a query's top-1 key is among those whose bound reaches its score."""
    batch, kv_heads, group, dim, page, slots = 1, 2, 2, 32, 16, 160
    lengths = torch.tensor([161 - 1 + 1], device=DEVICE)  # every page full but the current one
    for seed in range(5):
        keys, highest, lowest = keys_and_bounds(batch, kv_heads, slots + 1, dim, page, lengths, torch.float32, seed)
        q = torch.randn(batch, kv_heads * group, dim, generator=torch.Generator().manual_seed(seed + 9)).to(DEVICE)
        scores = page_scores(q, highest, lowest, keys, lengths, page)[0]  # [H_kv, P]
        exact = torch.einsum("hgd,hsd->hs", q.view(kv_heads, group, dim), keys[0, :, :slots])  # summed over g
        for head in range(kv_heads):
            best = int(exact[head].argmax())
            assert scores[head, best // page] >= exact[head, best] - 1e-4
            assert (scores[head, : slots // page] >= exact[head].view(-1, page).amax(dim=1) - 1e-4).all()


@pytest.mark.parametrize("lengths", [[1, 200], [129, 77]])
def test_token_scores_match_the_reference(lengths):
    batch, kv_heads, group, dim, slots = 2, 2, 4, 32, 260
    generator = torch.Generator().manual_seed(3)
    keys = torch.randn(batch, kv_heads, slots, dim, generator=generator).to(DEVICE)
    q = torch.randn(batch, kv_heads * group, dim, generator=generator).to(DEVICE)
    lengths = torch.tensor(lengths, device=DEVICE)
    want = token_scores_reference(q, keys, lengths)
    got = token_scores(q, keys, lengths)
    assert torch.equal(torch.isfinite(want), torch.isfinite(got))
    torch.testing.assert_close(got[torch.isfinite(got)], want[torch.isfinite(want)], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("lengths", [[3, 90], [41, 64], [200, 1]])
def test_expand_positions_lists_the_chosen_pages_then_the_current_one(page, lengths):
    batch, heads, chosen_pages, pages = 2, 3, 5, 64
    lengths = torch.tensor(lengths, device=DEVICE)
    scores = torch.randn(batch, heads, pages, generator=torch.Generator().manual_seed(page)).to(DEVICE)
    current = (lengths - 1) // page
    scores = scores.masked_fill(~(torch.arange(pages, device=DEVICE) < current[:, None])[:, None], float("-inf"))
    chosen = radix_top_k(scores, chosen_pages, 0)
    want_positions, want_counts = expand_positions_reference(chosen, lengths, page)
    positions = torch.full((batch, heads, (chosen_pages + 1) * page), -7, dtype=torch.long, device=DEVICE)
    counts = torch.zeros(batch, heads, dtype=torch.int32, device=DEVICE)
    expand_positions(chosen, lengths, page, positions, counts)
    assert torch.equal(counts.long(), want_counts.long()) and torch.equal(positions, want_positions)
    for b in range(batch):
        listed = positions[b, 0, : int(counts[b, 0])].tolist()
        assert len(set(listed)) == len(listed) and max(listed) == int(lengths[b]) - 1  # the newest slot is read
        assert all(slot < int(lengths[b]) for slot in listed)
        expected_pages = min(int(current[b]), chosen_pages)
        assert len(listed) == expected_pages * page + (int(lengths[b]) - 1) % page + 1
