"""An optimized SFI step's first launch (optimized/step_state_kernel.py) against its torch reference.

Random states mix every case a step meets: rows with nothing published yet (-1), rows reading densely
(a slow or bridge row) whatever their buffer, tails past the current length (tokens read from the tail
clamp at 0) and both buffers. Outputs start poisoned, so a value the kernel fails to write shows.
"""

from __future__ import annotations

import os

import pytest
import torch

from sfibench.optimized.step_state_kernel import take_published, take_published_reference

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def random_state(layers: int, rows: int, kv_heads: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    published = torch.randint(-1, 2, (layers, rows), generator=generator)  # -1: nothing published yet
    dense_rows = torch.rand(layers, rows, generator=generator) < 0.3
    compact_counts = torch.randint(0, 3000, (2, layers, rows, kv_heads), generator=generator,
                                   dtype=torch.int32)
    kv_lengths = torch.randint(1, 200_000, (rows,), generator=generator)
    # Tails mostly inside the history, some past its end (a length that has not reached the anchor)
    tail_start = (kv_lengths[None, None, :] - torch.randint(-50, 400, (2, layers, rows), generator=generator))
    tensors = (published, dense_rows, compact_counts, tail_start.clamp(min=0).int(), kv_lengths)
    return [tensor.to(DEVICE) for tensor in tensors]


def outputs(layers: int, rows: int, kv_heads: int):
    return (torch.full((layers, rows), 7, dtype=torch.long, device=DEVICE),
            torch.full((layers, rows), 7, dtype=torch.int32, device=DEVICE),
            torch.full((layers, rows, kv_heads), -7, dtype=torch.long, device=DEVICE))


@pytest.mark.parametrize("layers,rows,kv_heads", [(36, 5, 8), (3, 1, 1), (4, 3, 6), (28, 64, 8)])
def test_take_published_matches_reference(layers, rows, kv_heads):
    state = random_state(layers, rows, kv_heads, seed=layers * 1000 + rows * 10 + kv_heads)
    expected, got = outputs(layers, rows, kv_heads), outputs(layers, rows, kv_heads)
    take_published_reference(*state, *expected)
    take_published(*state, *got)
    for want, have in zip(expected, got):
        assert torch.equal(want, have)
    # And the reference says what the step needs: dense or unpublished rows read the whole history.
    published, dense_rows, _, _, kv_lengths = state
    live, row_buffer, tokens_read = got
    assert torch.equal(live, published)
    whole = dense_rows | (published < 0)
    assert torch.equal(row_buffer < 0, whole)
    assert torch.equal(tokens_read[whole], kv_lengths[None, :, None].expand_as(tokens_read)[whole])
    assert bool((tokens_read[~whole] >= 0).all())


def test_take_published_refuses_a_strided_tensor():
    published, dense_rows, compact_counts, tail_start, kv_lengths = random_state(4, 3, 2, seed=1)
    live, row_buffer, tokens_read = outputs(4, 3, 2)
    with pytest.raises(ValueError, match="contiguous"):
        take_published(published.t().contiguous().t(), dense_rows, compact_counts, tail_start, kv_lengths,
                       live, row_buffer, tokens_read)
