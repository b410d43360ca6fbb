"""optimized/qkv_epilogue.py (the qkv product with q/k norm, RoPE and the KV append as its epilogue) against
its reference, fused.linear_qk_norm_rope_append in plain torch, on random inputs: under TRITON_INTERPRET=1 on
the CPU, on CUDA when there is a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sfibench.models import fused
from sfibench.models.rope import inverse_frequencies, rope_cos_sin
from sfibench.optimized import gemv, qkv_epilogue

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(batch, heads, kv_heads, head_dim, hidden, slots, dtype, bias, norm, seed):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(DEVICE, dtype)

    width = (heads + 2 * kv_heads) * head_dim
    x, w = rand(batch, 1, hidden), rand(width, hidden, scale=hidden ** -0.5)
    b = rand(width) if bias else None
    norms = (1 + 0.1 * rand(head_dim), 1 + 0.1 * rand(head_dim), 1e-6) if norm else (None, None, 0.0)
    positions = torch.randint(0, slots, (batch,), generator=g)
    if batch > 1:
        positions[0] = slots + 3  # a bad position writes nothing
    inv_freq, amplitude = inverse_frequencies(head_dim, 10000.0, None)
    cos, sin = rope_cos_sin(inv_freq, amplitude, positions[:, None].clamp(max=slots - 1), dtype)
    caches = [rand(batch, kv_heads, slots, head_dim) for _ in range(2)] + \
        [torch.rand(batch, kv_heads, slots, generator=g).to(DEVICE)]
    return x, w, b, norms, cos.to(DEVICE), sin.to(DEVICE), caches, positions.to(DEVICE)


@pytest.mark.parametrize("batch,heads,kv_heads,head_dim,block_n", [
    (1, 4, 2, 32, 16),   # two programs per head
    (3, 6, 2, 64, 16),   # four programs per head, a batch
    (5, 4, 1, 32, 32),   # one program per head
])
@pytest.mark.parametrize("bias,norm", [(False, True), (True, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32])
def test_one_launch_matches_the_product_then_the_q_k_kernel(batch, heads, kv_heads, head_dim, block_n, bias, norm,
                                                            dtype):
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    x, w, b, norms, cos, sin, caches, positions = _inputs(batch, heads, kv_heads, head_dim, 48, 20, dtype, bias,
                                                          norm, seed=batch * head_dim)
    want_caches = [c.clone() for c in caches]
    in_range = positions.clamp(max=caches[0].shape[2] - 1)  # the reference scatters, which refuses a bad slot
    want_q = fused.qk_norm_rope_append(F.linear(x, w, b), *norms, cos, sin, heads, kv_heads, *want_caches, in_range)
    bad = positions >= caches[0].shape[2]
    for want, original in zip(want_caches, caches):
        want[bad] = original[bad]  # ... and the kernel writes nothing there
    config = gemv.GemvConfig(block_n=block_n, block_k=16)
    for _ in range(2):  # a second launch finds every head's counter zeroed again
        got_caches = [c.clone() for c in caches]
        q = qkv_epilogue.linear_qk_norm_rope_append(x, w, b, *norms, cos, sin, heads, kv_heads, *got_caches,
                                                    positions, config=config)
        torch.testing.assert_close(q, want_q, **tolerance)
        for got, want in zip(got_caches, want_caches):
            torch.testing.assert_close(got, want, **tolerance)
    assert not torch.equal(got_caches[0][~bad], caches[0][~bad])  # the good rows were written
    assert torch.equal(got_caches[0][bad], caches[0][bad]) and bool(bad.any()) == (batch > 1)
    counters = qkv_epilogue._head_counters(x.device, heads + 2 * kv_heads)
    assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32])
def test_a_folded_input_norm_scales_the_product_before_its_epilogue(dtype):
    """With `input_squares` (Decoder.fold_input_norms) x is the raw residual stream: the kernel scales the
    product by each row's 1 / rms from the partial sums before q/k norm, RoPE and the append."""
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    x, w, b, norms, cos, sin, caches, positions = _inputs(3, 4, 2, 32, 48, 20, dtype, True, True, seed=41)
    positions[0] = 2  # every slot in range: the reference scatters
    x = 3 * x
    partials = torch.stack([part.float().pow(2).sum(-1) for part in x[:, 0].split(20, dim=-1)]).contiguous()
    want_caches = [c.clone() for c in caches]
    want_q = fused.linear_qk_norm_rope_append(x, w, b, *norms, cos, sin, 4, 2, *want_caches, positions,
                                              input_squares=partials, input_eps=1e-6)
    got_caches = [c.clone() for c in caches]
    q = qkv_epilogue.linear_qk_norm_rope_append(x, w, b, *norms, cos, sin, 4, 2, *got_caches, positions,
                                                config=gemv.GemvConfig(block_n=16, block_k=16),
                                                input_squares=partials, input_eps=1e-6)
    torch.testing.assert_close(q, want_q, **tolerance)
    for got, want in zip(got_caches, want_caches):
        torch.testing.assert_close(got, want, **tolerance)
    unscaled_caches = [c.clone() for c in caches]
    fused.linear_qk_norm_rope_append(x, w, b, *norms, cos, sin, 4, 2, *unscaled_caches, positions)
    assert not torch.allclose(unscaled_caches[1], want_caches[1], **tolerance)  # v is not normed: the scale shows


def test_shapes_it_does_not_serve_take_the_two_launch_route():
    """A tile wider than a head is narrowed; for one that does not divide the head the kernel answers None
    and writes nothing, and the fused op runs the two-launch reference instead."""
    x, w, _, norms, cos, sin, caches, positions = _inputs(2, 2, 1, 32, 24, 10, torch.float32, False, True, seed=3)
    positions[0] = 1  # every slot in range here: the fallback's reference scatter needs that
    want_caches = [c.clone() for c in caches]
    want_q = fused.qk_norm_rope_append(F.linear(x, w), *norms, cos, sin, 2, 1, *want_caches, positions)
    got_caches = [c.clone() for c in caches]
    q = qkv_epilogue.linear_qk_norm_rope_append(x, w, None, *norms, cos, sin, 2, 1, *got_caches, positions,
                                                config=gemv.GemvConfig(block_n=64, block_k=16))
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_caches[0], want_caches[0], atol=1e-5, rtol=1e-5)
    untouched = [c.clone() for c in caches]
    assert qkv_epilogue.linear_qk_norm_rope_append(x, w, None, *norms, cos, sin, 2, 1, *untouched, positions,
                                                   config=gemv.GemvConfig(block_n=24, block_k=16)) is None
    assert all(torch.equal(u, c) for u, c in zip(untouched, caches))
    fallback = fused._kernel_or(lambda *args, **kwargs: None, fused.linear_qk_norm_rope_append)
    got_caches = [c.clone() for c in caches]
    torch.testing.assert_close(fallback(x, w, None, *norms, cos, sin, 2, 1, *got_caches, positions), want_q,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_caches[0], want_caches[0], atol=1e-5, rtol=1e-5)


def test_fusion_routes_the_qkv_product_through_this_kernel():
    try:
        fused.enable_fusion(True)
        assert fused.ops["linear_qk_norm_rope_append"].kernel is qkv_epilogue.linear_qk_norm_rope_append
    finally:
        fused.enable_fusion(False)
    assert fused.ops["linear_qk_norm_rope_append"] is fused.linear_qk_norm_rope_append
