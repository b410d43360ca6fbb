"""optimized/pdl.py: which kernels launch with programmatic dependent launch, and unknown kinds refused.
(That chains of PDL launches give serial launches' numbers is a GPU test: tests/kernels/test_gemv.py,
tests/engine/test_graphs.py.)"""

from __future__ import annotations

import pytest
import torch
from test_kernels import DEVICE

from sfibench.optimized import pdl


def test_never_on_the_cpu():
    for kind in pdl.KINDS:
        assert not pdl.enabled(torch.device("cpu"), kind)
        assert pdl.launch_options(torch.device("cpu"), kind) == {"PDL": False}


def test_products_and_short_splits_launch_with_pdl_and_dense_reads_without():
    assert pdl.WITH_PDL == {"products", "short_attention"}
    assert set(pdl.KINDS) - pdl.WITH_PDL == {"attention"}


def test_an_attention_launch_asks_for_the_kind_its_split_length_gives(monkeypatch):
    """Short splits (a fast step's) are `short_attention`, any other launch `attention`: what WITH_PDL keys on."""
    from sfibench.optimized import decode_attention
    from sfibench.optimized.two_segment import two_segment_decode

    kinds = []
    monkeypatch.setattr(pdl, "launch_options", lambda device, kind: kinds.append(kind) or {"PDL": False})
    on = {"device": DEVICE}
    q, kv = torch.randn(1, 4, 16, **on), torch.randn(1, 2, 40, 16, **on)
    lengths = torch.tensor([40], **on)
    decode_attention.dense_decode(q, kv, kv, lengths)
    compact = torch.zeros(2, 1, 2, 8, 16, **on)
    args = (q, compact, compact, torch.zeros(2, 1, 2, dtype=torch.int32, **on), kv, kv,
            torch.zeros(2, 1, dtype=torch.int32, **on), lengths, torch.zeros(1, dtype=torch.int32, **on))
    two_segment_decode(*args)
    two_segment_decode(*args, short_splits=True)
    assert kinds == ["attention", "attention", "short_attention"]


def test_an_unknown_kernel_kind_is_refused():
    with pytest.raises(ValueError, match="unknown kernel kind"):
        pdl.enabled(torch.device("cpu"), "merge")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only description")
def test_reports_say_pdl_is_off_without_a_gpu():
    assert pdl.describe() == "off (no CUDA device)"
