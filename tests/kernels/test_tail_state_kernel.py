"""An optimized StreamingLLM or SnapKV step's first launch (optimized/tail_state_kernel.py) against its torch
reference.

Lengths mix rows shorter than the sinks, rows whose window reaches back into the sinks and long rows;
SnapKV's tails lie before, at and past the current length. Outputs the kernel writes start poisoned, so a
value it fails to write shows; the inputs it only reads must come back unchanged.
"""

from __future__ import annotations

import os

import pytest
import torch

from sfibench.optimized.tail_state_kernel import begin_tail_step, begin_tail_step_reference

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def random_state(layers: int, rows: int, kv_heads: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    kv_lengths = torch.randint(1, 3000, (rows,), generator=generator)
    kv_lengths[0] = 2  # fewer tokens than sinks
    counts = torch.randint(0, 2000, (1, layers, rows, kv_heads), generator=generator, dtype=torch.int32)
    tail = (kv_lengths - torch.randint(-20, 300, (rows,), generator=generator)).clamp(min=0).int()[None]
    tokens_read = torch.full((layers, rows, kv_heads), -7, dtype=torch.long)
    return [tensor.to(DEVICE) for tensor in (kv_lengths, counts, tail, tokens_read)]


@pytest.mark.parametrize("sinks", [(4, 2044), (4, 1), None])
@pytest.mark.parametrize("layers,rows,kv_heads", [(28, 7, 8), (3, 1, 1), (4, 3, 6)])
def test_begin_tail_step_matches_reference(layers, rows, kv_heads, sinks):
    seed = layers * 1000 + rows * 10 + kv_heads
    expected, got = random_state(layers, rows, kv_heads, seed), random_state(layers, rows, kv_heads, seed)
    if sinks is not None:  # StreamingLLM's counts and tail are outputs: poison the kernel's copies
        got[1].fill_(-7)
        got[2].fill_(-7)
    begin_tail_step_reference(*expected, sinks)
    begin_tail_step(*got, sinks)
    for want, have in zip(expected, got):
        assert torch.equal(want, have)
    _, counts, _, tokens_read = got
    if sinks is not None:  # and the reference says what StreamingLLM reads: sinks + window, at most budget
        assert int(counts[0, 0, 0, 0]) == 2 and int(tokens_read[:, 0].max()) == 2
        assert int(tokens_read.max()) <= sum(sinks)


def test_begin_tail_step_refuses_shapes_it_cannot_index():
    kv_lengths, counts, tail, tokens_read = random_state(2, 3, 4, 0)
    with pytest.raises(ValueError, match="counts \\[1, L, B, H_kv\\]"):
        begin_tail_step(kv_lengths, counts, tail, tokens_read[:, :2], None)
    with pytest.raises(ValueError, match="contiguous"):
        strided = tokens_read.transpose(0, 1).contiguous().transpose(0, 1)  # the same shape, not contiguous
        begin_tail_step(kv_lengths, counts, tail, strided, None)
