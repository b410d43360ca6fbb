"""The compact rebuild's Triton gather against its torch reference (sfi/state.gather_compact).

Without CUDA the kernel runs under the Triton interpreter (conftest.py). Compact buffers start
NaN-poisoned, so a missing write shows as NaN and a write outside the rows [0, sinks + K) of the
listed (buffer, layer, row) shows as a value where NaN should have stayed.
"""

from __future__ import annotations

import os

import pytest
import torch

from sfibench.optimized.compact_kernels import gather_compact
from sfibench.sfi import state

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"

CASES = [  # layers, batch, kv_heads, slots, dim, listed layers, row, buffer, sinks, picks per head, dtype,
    # and the window's first rows moved after them: (first slot, rows)
    (3, 2, 2, 50, 16, [0, 2], 1, 0, 4, 7, torch.float32, (0, 0)),
    (4, 3, 4, 300, 64, [0, 1, 2, 3], 2, 1, 4, 130, torch.bfloat16, (0, 0)),  # several row blocks per head
    (2, 1, 1, 20, 80, [1], 0, 1, 0, 5, torch.float32, (0, 0)),  # no sinks; head_dim not a power of two
    (2, 2, 2, 40, 32, [0, 1], 0, 0, 3, 0, torch.float32, (0, 0)),  # sinks only (no candidates yet)
    (3, 2, 2, 90, 16, [0, 2], 1, 1, 4, 7, torch.float32, (70, 5)),  # window rows after the picks
    (2, 2, 4, 300, 64, [0, 1], 0, 0, 4, 100, torch.bfloat16, (240, 60)),  # ... across a row block's edge
    (2, 1, 2, 40, 16, [1], 0, 0, 3, 0, torch.float32, (20, 9)),  # sinks and window rows, no picks
]


@pytest.mark.parametrize("layers,batch,heads,slots,dim,listed,row,buffer,sinks,picked,dtype,window", CASES)
def test_gather_compact_matches_reference(layers, batch, heads, slots, dim, listed, row, buffer, sinks,
                                          picked, dtype, window):
    generator = torch.Generator().manual_seed(len(listed) * 100 + picked)
    k_cache = torch.randn(layers, batch, heads, slots, dim, generator=generator).to(dtype).to(DEVICE)
    v_cache = torch.randn(layers, batch, heads, slots, dim, generator=generator).to(dtype).to(DEVICE)
    window_start, window_rows = window
    rows = sinks + picked + window_rows + 3  # spare rows that must stay untouched
    # Ascending distinct candidate positions between the sinks and the window, different per (layer, head).
    def ascending_picks():
        below = (window_start or slots) - sinks
        return torch.randperm(below, generator=generator)[:picked].sort().values + sinks

    picks = torch.stack([torch.stack([ascending_picks() for _ in range(heads)]) for _ in listed])
    picks = picks.to(DEVICE)
    target = torch.tensor(listed, device=DEVICE)
    expected = [torch.full((2, layers, batch, heads, rows, dim), float("nan"), dtype=dtype, device=DEVICE)
                for _ in range(2)]
    got = [tensor.clone() for tensor in expected]
    state.gather_compact(k_cache, v_cache, *expected, buffer, target, row, sinks, picks, *window)
    gather_compact(k_cache, v_cache, *got, buffer, target, row, sinks, picks, *window)
    for want, have in zip(expected, got):
        assert torch.equal(want.isnan(), have.isnan())  # same rows written, nothing else
        assert torch.equal(want.nan_to_num(), have.nan_to_num())  # a copy: bit for bit
    # And the reference itself holds what it should: sinks first, then the picks, then the window's rows,
    # from this row's cache.
    for i, layer in enumerate(listed):
        for head in range(heads):
            positions = torch.cat([torch.arange(sinks, device=DEVICE), picks[i, head],
                                   torch.arange(window_start, window_start + window_rows, device=DEVICE)])
            written = slice(0, sinks + picked + window_rows)
            assert torch.equal(got[0][buffer, layer, row, head, written], k_cache[layer, row, head, positions])
            assert torch.equal(got[1][buffer, layer, row, head, written], v_cache[layer, row, head, positions])


def test_gather_compact_refuses_picks_that_do_not_fit():
    cache = torch.zeros(1, 1, 1, 16, 8, device=DEVICE)
    compact = torch.zeros(2, 1, 1, 1, 4, 8, device=DEVICE)
    picks = torch.arange(4, 8, device=DEVICE).view(1, 1, 4)
    with pytest.raises(ValueError, match="do not fit a compact buffer of 4 rows"):
        gather_compact(cache, cache, compact, compact.clone(), 0, torch.tensor([0], device=DEVICE), 0, 2,
                       picks)
    with pytest.raises(ValueError, match="2 sinks \\+ 1 picks \\+ 2 window rows do not fit"):
        gather_compact(cache, cache, compact, compact.clone(), 0, torch.tensor([0], device=DEVICE), 0, 2,
                       picks[..., :1], 12, 2)


@pytest.mark.parametrize("length,picked,moved", [
    (400, 57, 3),  # 4 sinks + 57 picks = 61 rows: 3 of the window's first rows fill the tile
    (400, 60, 0),  # 64 rows already: nothing moves
    (400, 61, 31),  # 65 rows: 31 to the next tile edge (96 with align 32)
    (150, 57, 3),
])
def test_rebuild_fills_the_compact_segment_to_a_tile_edge_with_the_window_head(length, picked, moved):
    """SelectionState.write with `align`: the compact segment (sinks, picks, then the window's first rows)
    ends on a multiple of `align` rows, and the tail in place starts after the rows moved. Compact rows and
    tail together are exactly sinks + picks + the whole window, each once."""
    from sfibench.sfi.config import SFIConfig

    align = 64 if picked < 61 else 32
    cfg = SFIConfig(n_sink=4, n_recent=32, k_head=picked, page=16)
    layers, heads, dim = 2, 2, 8
    cache = type("Cache", (), {})()
    cache.k = torch.randn(layers, 1, heads, 512, dim)
    cache.v = torch.randn(layers, 1, heads, 512, dim)
    sel = state.SelectionState(cfg, layers, 1, heads, "cpu", dim, torch.float32, align=align)
    assert sel.compact_k.shape[4] % align == 0
    lo, hi = 4, (length - 32) // 16 * 16  # geometry.candidate_range
    picks = torch.stack([torch.randperm(hi - lo)[:picked].sort().values + lo for _ in range(layers * heads)])
    picks = picks.view(layers, heads, picked)
    sel.publish([0, 1], 0, sel.write([0, 1], 0, picks, length, cache))
    buffer = int(sel.published[0, 0])
    counts, tail_start = sel.compact_counts[buffer, :, 0], sel.tail_start[buffer, :, 0]
    assert torch.equal(counts, torch.full_like(counts, 4 + picked + moved))
    assert torch.equal(tail_start, torch.full_like(tail_start, hi + moved))
    for layer in range(layers):
        for head in range(heads):
            read = torch.cat([sel.compact_k[buffer, layer, 0, head, :4 + picked + moved],
                              cache.k[layer, 0, head, hi + moved:length]])
            positions = torch.cat([torch.arange(4), picks[layer, head], torch.arange(hi, length)])
            assert torch.equal(read, cache.k[layer, 0, head, positions])
