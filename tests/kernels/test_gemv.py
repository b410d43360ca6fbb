"""The Triton GEMV (optimized/gemv.py) against its torch references (models/fused.py after F.linear), on
random inputs; under TRITON_INTERPRET=1 on the CPU, on CUDA when there is a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sfibench.models import fused
from sfibench.optimized import gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (rows, N, K): one row and a batch; K not a multiple of the tile; N not a multiple of the column block
SHAPES = [(1, 96, 64), (5, 70, 200), (3, 33, 320)]
SMALL = gemv.GemvConfig(block_n=16, block_k=64)


def _tolerance(dtype):
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def _dtypes():
    return [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


def _random(generator, *shape, scale=1.0, dtype=torch.float32):
    return (scale * torch.randn(*shape, generator=generator)).to(DEVICE, dtype)


@pytest.mark.parametrize("rows,n_out,n_in", SHAPES)
@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear(rows, n_out, n_in, dtype, bias):
    g = torch.Generator().manual_seed(rows * n_out)
    x = _random(g, rows, 1, n_in, dtype=dtype)
    w = _random(g, n_out, n_in, scale=n_in ** -0.5, dtype=dtype)
    b = _random(g, n_out, dtype=dtype) if bias else None
    got = gemv.linear(x, w, b, config=SMALL)
    assert got.shape == (rows, 1, n_out)
    torch.testing.assert_close(got, F.linear(x, w, b), **_tolerance(dtype))


@pytest.mark.parametrize("rows,n_out,n_in", SHAPES)
@pytest.mark.parametrize("dtype", _dtypes())
def test_add_rms_norm_epilogue_matches_linear_then_add_rms_norm(rows, n_out, n_in, dtype):
    g = torch.Generator().manual_seed(7 + rows)
    x = _random(g, rows, 1, n_in, dtype=dtype)
    w = _random(g, n_out, n_in, scale=n_in ** -0.5, dtype=dtype)
    residual = _random(g, rows, 1, n_out, scale=3.0, dtype=dtype)
    norm_w = (1 + 0.1 * torch.randn(n_out, generator=g)).to(DEVICE, dtype)
    want_sum, want_normed = fused.add_rms_norm(F.linear(x, w), residual, norm_w, 1e-6)
    for _ in range(2):  # a second launch finds the finish counter zeroed again
        summed, normed = gemv.linear_add_rms_norm(x, w, residual, norm_w, 1e-6, config=SMALL)
        torch.testing.assert_close(summed, want_sum, **_tolerance(dtype))
        torch.testing.assert_close(normed, want_normed, **_tolerance(dtype))
    assert int(gemv._done_counter(x.device)) == 0


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("dtype", _dtypes())
def test_gated_epilogues_match_linear_then_activation(activation, dtype):
    g = torch.Generator().manual_seed(3)
    x = _random(g, 4, 120, dtype=dtype)
    w = _random(g, 2 * 70, 120, scale=2 * 120 ** -0.5, dtype=dtype)  # gate rows, then up rows
    got = gemv.gate_up_activation(x, w, activation, config=SMALL)
    assert got.shape == (4, 70)
    torch.testing.assert_close(got, fused.EAGER[activation](F.linear(x, w)), **_tolerance(dtype))


@pytest.mark.parametrize("rows,n_out,n_in", SHAPES)
@pytest.mark.parametrize("dtype", _dtypes())
def test_add_squares_epilogue_gives_the_sum_and_each_programs_share_of_its_squares(rows, n_out, n_in, dtype):
    g = torch.Generator().manual_seed(17 + rows)
    x = _random(g, rows, 1, n_in, dtype=dtype)
    w = _random(g, n_out, n_in, scale=n_in ** -0.5, dtype=dtype)
    residual = _random(g, rows, 1, n_out, scale=3.0, dtype=dtype)
    want_sum, want_squares = fused.linear_add_squares(x, w, residual)
    summed, squares = gemv.linear_add_squares(x, w, residual, config=SMALL)
    torch.testing.assert_close(summed, want_sum, **_tolerance(dtype))
    assert squares.shape == (-(-n_out // SMALL.block_n), rows)  # one share per program and row
    # each program's share covers its own columns of the sum it stored
    stored = summed.reshape(rows, n_out).float()
    for program in range(squares.shape[0]):
        columns = stored[:, program * SMALL.block_n:(program + 1) * SMALL.block_n]
        torch.testing.assert_close(squares[program], columns.pow(2).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(squares.sum(0, keepdim=True), want_squares, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("rows,n_out,n_in", SHAPES)
@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("bias", [False, True])
def test_a_folded_input_norm_matches_the_norm_then_the_product(rows, n_out, n_in, dtype, bias):
    """W (g * x / rms(x)) = (W diag(g)) x / rms(x): the kernel, fed x raw, the folded weight and partial sums
    of squares split over several programs' shares, gives the product of the normalised input."""
    g = torch.Generator().manual_seed(29 + n_in)
    x = _random(g, rows, 1, n_in, scale=2.0, dtype=dtype)
    w = _random(g, n_out, n_in, scale=n_in ** -0.5, dtype=dtype)
    gain = (1 + 0.2 * torch.randn(n_in, generator=g)).to(DEVICE, dtype)
    b = _random(g, n_out, dtype=dtype) if bias else None
    folded = (w.float() * gain.float()[None, :]).to(dtype)
    squares = x.reshape(rows, n_in).float().pow(2)
    partials = torch.stack([part.sum(-1) for part in squares.split(48, dim=-1)]).contiguous()  # [parts, rows]
    got = gemv.linear(x, folded, b, config=SMALL, input_squares=partials, input_eps=1e-6)
    torch.testing.assert_close(got, fused.linear(x, folded, b, input_squares=partials, input_eps=1e-6),
                               **_tolerance(dtype))
    normed = fused.rms_norm(x.float(), gain.float(), 1e-6)
    unfolded = F.linear(normed, w.float(), None if b is None else b.float())
    torch.testing.assert_close(got.float(), unfolded, **_tolerance(dtype))
    with pytest.raises(ValueError, match="input_squares"):
        gemv.linear(x, folded, b, config=SMALL, input_squares=torch.ones(2, rows + 1, device=DEVICE),
                    input_eps=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_float32_output_holds_the_product_rounded_as_f_linear_rounds_it(dtype):
    """The LM head's logits: stored as float32 by the kernel, they are F.linear's values (in x's dtype)
    converted, bit for bit, so no conversion kernel has to follow."""
    g = torch.Generator().manual_seed(43)
    x, w = _random(g, 3, 96, dtype=dtype), _random(g, 70, 96, scale=0.2, dtype=dtype)
    want = gemv.linear(x, w, config=SMALL)
    got = gemv.linear(x, w, config=SMALL, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want.float())
    assert torch.equal(fused.linear(x, w, out_dtype=torch.float32), F.linear(x, w).float())


@pytest.mark.parametrize("dtype", _dtypes())
def test_add_squares_with_an_output_gain_scales_the_stream_but_not_its_squares(dtype):
    """The last layer's down_proj before a folded final norm: it writes g * (x W^T + residual), and the
    squares of the unscaled sum, which the LM head's 1 / rms needs."""
    g = torch.Generator().manual_seed(47)
    rows, n_out, n_in = 3, 70, 200
    x, w = _random(g, rows, n_in, dtype=dtype), _random(g, n_out, n_in, scale=n_in ** -0.5, dtype=dtype)
    residual = _random(g, rows, n_out, dtype=dtype)
    gain = (1 + 0.3 * torch.randn(n_out, generator=g)).to(DEVICE, dtype)
    plain, plain_squares = gemv.linear_add_squares(x, w, residual, config=SMALL)
    scaled, squares = gemv.linear_add_squares(x, w, residual, config=SMALL, output_gain=gain)
    assert torch.equal(squares, plain_squares)
    torch.testing.assert_close(scaled, gain * plain, **_tolerance(dtype))
    want, want_squares = fused.linear_add_squares(x, w, residual, output_gain=gain)
    torch.testing.assert_close(scaled, want, **_tolerance(dtype))
    torch.testing.assert_close(squares.sum(0), want_squares[0], **_tolerance(dtype))
    with pytest.raises(ValueError, match="output_gain"):
        gemv.linear_add_squares(x, w, residual, config=SMALL, output_gain=gain[:-1])


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("dtype", _dtypes())
def test_a_folded_post_attention_norm_matches_the_norm_then_the_gated_product(activation, dtype):
    """gate_up with the post-attention norm folded in: both halves are scaled by the input's 1 / rms before
    the activation, as the norm then the plain gated product would give; the reference agrees too."""
    g = torch.Generator().manual_seed(41)
    rows, n_in, half = 3, 120, 70
    x = _random(g, rows, n_in, scale=2.0, dtype=dtype)
    w = _random(g, 2 * half, n_in, scale=2 * n_in ** -0.5, dtype=dtype)
    gain = (1 + 0.2 * torch.randn(n_in, generator=g)).to(DEVICE, dtype)
    folded = (w.float() * gain.float()[None, :]).to(dtype)
    squares = x.float().pow(2)
    partials = torch.stack([part.sum(-1) for part in squares.split(32, dim=-1)]).contiguous()  # [parts, rows]
    got = gemv.gate_up_activation(x, folded, activation, config=SMALL, input_squares=partials, input_eps=1e-6)
    reference = fused.gate_up_activation(x, folded, activation, input_squares=partials, input_eps=1e-6)
    torch.testing.assert_close(got, reference, **_tolerance(dtype))
    unfolded = fused.EAGER[activation](F.linear(fused.rms_norm(x.float(), gain.float(), 1e-6), w.float()))
    torch.testing.assert_close(got.float(), unfolded, **_tolerance(dtype))
    unscaled = fused.EAGER[activation](F.linear(x.float(), folded.float()))
    assert not torch.allclose(got.float(), unscaled, atol=1e-2)  # the scale matters
    with pytest.raises(ValueError, match="input_squares"):
        gemv.gate_up_activation(x, folded, activation, config=SMALL, input_squares=partials[:, :2])


def test_shapes_the_kernel_does_not_serve_go_to_the_reference():
    """Prefill (more rows than decode has) is cuBLAS's (narrow products: the test after this one)."""
    assert gemv.decode_config(gemv.MAX_ROWS + 1, 6144, 2560, torch.device(DEVICE)) is None
    assert gemv.decode_config(1, 6144, 2560, torch.device(DEVICE)) == gemv.TUNED[(6144, 2560)]
    g = torch.Generator().manual_seed(5)
    x, w = _random(g, gemv.MAX_ROWS + 3, 40), _random(g, 24, 40)
    assert gemv.linear(x, w) is None
    torch.testing.assert_close(fused.kernel_ops()["linear"](x, w), F.linear(x, w))


def test_narrow_products_stay_on_this_kernel(monkeypatch):
    """qwen3-0.6b's o_proj (1,024 columns, 2,048 inputs) on an H200's 132 SMs: fewer programs than SMs, yet
    it runs here (with its epilogues and the norm folds); prefill stays cuBLAS's."""
    monkeypatch.setattr(gemv, "_sm_count", lambda device: 132)
    device = torch.device(DEVICE)
    assert gemv.decode_config(1, 1024, 2048, device) is not None
    assert gemv.decode_config(gemv.MAX_ROWS + 1, 1024, 2048, device) is None


def test_bad_inputs_are_named():
    w = torch.zeros(8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="does not fit weight"):
        gemv.linear(torch.zeros(1, 15, device=DEVICE), w)
    with pytest.raises(ValueError, match="dtype"):
        gemv.linear(torch.zeros(1, 16, device=DEVICE, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="unknown activation"):
        gemv.gate_up_activation(torch.zeros(1, 16, device=DEVICE), w, "relu")
    with pytest.raises(ValueError, match="residual"):
        gemv.linear_add_rms_norm(torch.zeros(1, 16, device=DEVICE), w, torch.zeros(1, 9, device=DEVICE),
                                 torch.ones(8, device=DEVICE), 1e-6, config=SMALL)


def test_tiles_are_fitted_to_shared_memory():
    """A gated product streams two weight tiles per stage, float32 doubles their bytes: the pipeline is cut
    to fit (an H200 refused 240 KB), never below two stages."""
    big = gemv.GemvConfig(block_n=32, block_k=512, num_stages=4)
    for tiles, itemsize in ((1, 2), (2, 2), (2, 4)):
        fitted = gemv.fit_shared_memory(big, 9728, tiles, itemsize)
        assert fitted.num_stages * (gemv.MAX_ROWS + tiles * fitted.block_n) * fitted.block_k * itemsize \
            <= gemv.SHARED_MEMORY_BUDGET
        assert fitted.num_stages >= 2 and fitted.block_n == 32
    assert gemv.fit_shared_memory(big, 9728, 1, 2) == big  # the tuned 4B tile already fits
    assert gemv.fit_shared_memory(big, 64, 1, 2).block_k == 64  # never wider than K


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="PDL and CUDA graphs need a CUDA device")
def test_a_graphed_chain_with_pdl_matches_serial_launches(monkeypatch):
    """Each product reads the one before's output: with programmatic dependent launch (on where the GPU has
    it) a kernel that read its input before the previous kernel finished would give other numbers than
    launches serialised the plain way (no kind in pdl.WITH_PDL)."""
    from sfibench.optimized import pdl

    g = torch.Generator().manual_seed(11)
    width, hidden = 256, 512
    x = _random(g, 2, width, dtype=torch.bfloat16)
    residual = _random(g, 2, width, dtype=torch.bfloat16)
    norm_w = torch.ones(width, device=DEVICE, dtype=torch.bfloat16)
    weights = [(_random(g, 2 * hidden, width, scale=width ** -0.5, dtype=torch.bfloat16),
                _random(g, width, hidden, scale=hidden ** -0.5, dtype=torch.bfloat16)) for _ in range(6)]

    def chain():
        stream, normed = residual, x
        for up, down in weights:
            stream, normed = gemv.linear_add_rms_norm(gemv.gate_up_activation(normed, up, "silu_mul", config=SMALL),
                                                      down, stream, norm_w, 1e-6, config=SMALL)
        return normed

    monkeypatch.setattr(pdl, "WITH_PDL", frozenset())
    serial = chain()
    monkeypatch.setattr(pdl, "WITH_PDL", frozenset(pdl.KINDS))
    chain()  # compile the PDL variants before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, serial)
