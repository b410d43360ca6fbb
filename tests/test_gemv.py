"""The Triton GEMV (optimized/gemv.py) against its torch references (models/fused.py + F.linear), on
random inputs; under TRITON_INTERPRET=1 on the CPU, on CUDA when there is a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sfibench.models import fused
from sfibench.optimized.gemv import MAX_ROWS, gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (rows, N, K): one row and a batch; K not a multiple of the tile; N not a multiple of the column block
SHAPES = [(1, 96, 64), (5, 70, 200), (3, 33, 320)]


def _tolerance(dtype):
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def _dtypes():
    return [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


@pytest.mark.parametrize("rows,n_out,n_in", SHAPES)
@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("bias", [False, True])
def test_plain_product_matches_linear(rows, n_out, n_in, dtype, bias):
    g = torch.Generator().manual_seed(rows * n_out)
    x = torch.randn(rows, 1, n_in, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(DEVICE, dtype)
    b = torch.randn(n_out, generator=g).to(DEVICE, dtype) if bias else None
    got = gemv(x, w, b, block_n=16, block_k=64)
    assert got.shape == (rows, 1, n_out)
    torch.testing.assert_close(got, F.linear(x, w, b), **_tolerance(dtype))


@pytest.mark.parametrize("rows,n_out,n_in", SHAPES)
@pytest.mark.parametrize("dtype", _dtypes())
def test_norm_prologues_match_the_norm_then_linear(rows, n_out, n_in, dtype):
    g = torch.Generator().manual_seed(7 + rows)
    x = (3 * torch.randn(rows, n_in, generator=g)).to(DEVICE, dtype)
    residual = torch.randn(rows, n_in, generator=g).to(DEVICE, dtype)
    norm_w = (1 + 0.1 * torch.randn(n_in, generator=g)).to(DEVICE, dtype)
    w = (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(DEVICE, dtype)
    got = gemv(x, w, prologue="norm", norm_weight=norm_w, eps=1e-6, block_n=32, block_k=64)
    torch.testing.assert_close(got, F.linear(fused.rms_norm(x, norm_w, 1e-6), w), **_tolerance(dtype))
    summed, got = gemv(x, w, prologue="add_norm", residual=residual, norm_weight=norm_w, eps=1e-6, block_n=16,
                       block_k=64)
    want_sum, want_normed = fused.add_rms_norm(x, residual, norm_w, 1e-6)
    torch.testing.assert_close(summed, want_sum, atol=0, rtol=0)  # the residual stream is exact
    torch.testing.assert_close(got, F.linear(want_normed, w), **_tolerance(dtype))


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("dtype", _dtypes())
def test_gated_prologues_match_the_activation_then_linear(activation, dtype):
    g = torch.Generator().manual_seed(3)
    gate_up = (2 * torch.randn(4, 2 * 200, generator=g)).to(DEVICE, dtype)
    w = (torch.randn(48, 200, generator=g) / 200 ** 0.5).to(DEVICE, dtype)
    got = gemv(gate_up, w, prologue=activation, block_n=16, block_k=64)
    torch.testing.assert_close(got, F.linear(fused.EAGER[activation](gate_up), w), **_tolerance(dtype))


def test_bad_inputs_are_named():
    w = torch.zeros(8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="does not fit weight"):
        gemv(torch.zeros(1, 15, device=DEVICE), w)
    with pytest.raises(ValueError, match="at most"):
        gemv(torch.zeros(MAX_ROWS + 1, 16, device=DEVICE), w)
    with pytest.raises(ValueError, match="needs norm_weight"):
        gemv(torch.zeros(1, 16, device=DEVICE), w, prologue="norm")
    with pytest.raises(ValueError, match="unknown prologue"):
        gemv(torch.zeros(1, 16, device=DEVICE), w, prologue="relu")
