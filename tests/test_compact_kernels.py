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

CASES = [  # layers, batch, kv_heads, slots, dim, listed layers, row, buffer, sinks, picks per head, dtype
    (3, 2, 2, 50, 16, [0, 2], 1, 0, 4, 7, torch.float32),
    (4, 3, 4, 300, 64, [0, 1, 2, 3], 2, 1, 4, 130, torch.bfloat16),  # several row blocks per head
    (2, 1, 1, 20, 80, [1], 0, 1, 0, 5, torch.float32),  # no sinks; head_dim not a power of two
    (2, 2, 2, 40, 32, [0, 1], 0, 0, 3, 0, torch.float32),  # sinks only (no candidates yet)
]


@pytest.mark.parametrize("layers,batch,heads,slots,dim,listed,row,buffer,sinks,picked,dtype", CASES)
def test_gather_compact_matches_reference(layers, batch, heads, slots, dim, listed, row, buffer, sinks,
                                          picked, dtype):
    generator = torch.Generator().manual_seed(len(listed) * 100 + picked)
    k_cache = torch.randn(layers, batch, heads, slots, dim, generator=generator).to(dtype).to(DEVICE)
    v_cache = torch.randn(layers, batch, heads, slots, dim, generator=generator).to(dtype).to(DEVICE)
    rows = sinks + picked + 3  # spare rows that must stay untouched
    # Ascending distinct candidate positions after the sinks, different per (layer, head).
    def ascending_picks():
        return torch.randperm(slots - sinks, generator=generator)[:picked].sort().values + sinks

    picks = torch.stack([torch.stack([ascending_picks() for _ in range(heads)]) for _ in listed])
    picks = picks.to(DEVICE)
    target = torch.tensor(listed, device=DEVICE)
    expected = [torch.full((2, layers, batch, heads, rows, dim), float("nan"), dtype=dtype, device=DEVICE)
                for _ in range(2)]
    got = [tensor.clone() for tensor in expected]
    state.gather_compact(k_cache, v_cache, *expected, buffer, target, row, sinks, picks)
    gather_compact(k_cache, v_cache, *got, buffer, target, row, sinks, picks)
    for want, have in zip(expected, got):
        assert torch.equal(want.isnan(), have.isnan())  # same rows written, nothing else
        assert torch.equal(want.nan_to_num(), have.nan_to_num())  # a copy: bit for bit
    # And the reference itself holds what it should: sinks first, then the picks, from this row's cache.
    for i, layer in enumerate(listed):
        for head in range(heads):
            positions = torch.cat([torch.arange(sinks, device=DEVICE), picks[i, head]])
            written = slice(0, sinks + picked)
            assert torch.equal(got[0][buffer, layer, row, head, written], k_cache[layer, row, head, positions])
            assert torch.equal(got[1][buffer, layer, row, head, written], v_cache[layer, row, head, positions])


def test_gather_compact_refuses_picks_that_do_not_fit():
    cache = torch.zeros(1, 1, 1, 16, 8, device=DEVICE)
    compact = torch.zeros(2, 1, 1, 1, 4, 8, device=DEVICE)
    picks = torch.arange(4, 8, device=DEVICE).view(1, 1, 4)
    with pytest.raises(ValueError, match="do not fit a compact buffer of 4 rows"):
        gather_compact(cache, cache, compact, compact.clone(), 0, torch.tensor([0], device=DEVICE), 0, 2,
                       picks)
