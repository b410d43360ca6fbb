"""The attention kernels finishing the step's new token (optimized/new_token.py) against doing it first.

Each case runs a split kernel with a fused.NewToken in place of q and checks it against the route it replaces:
layer_kernels.qk_norm_rope_append (the q/k kernel, itself checked against fused.qk_norm_rope_append in
test_fused_kernels.py; the same float32 arithmetic, so the same q) on a copy of the cache, then the float64
attention oracle over that copy. The step's own cache slot starts poisoned (NaN key, 1e30 value), so a
kernel that read the slot before writing it, or never wrote it, fails; every other slot must be untouched.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_kernels import DEVICE, NEVER_READ_KEY, NEVER_READ_VALUE, assert_matches
from test_two_segment import DENSE, two_segment_inputs

from sfibench.models.fused import NewToken
from sfibench.models.rope import inverse_frequencies, rope_cos_sin
from sfibench.optimized import layer_kernels, new_token
from sfibench.optimized.decode_attention import dense_decode
from sfibench.optimized.decode_reference import dense_decode_reference, two_segment_decode_reference
from sfibench.optimized.two_segment import two_segment_decode


def new_token_for(k, v, lengths, num_heads, dtype, seed, qk_norm=True):
    """A NewToken appending at slot lengths[b] - 1 of k/v `[B, H_kv, S, D]`, with its own key norms."""
    batch, kv_heads, slots, head_dim = k.shape
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, (num_heads + 2 * kv_heads) * head_dim, generator=gen)
    weights = [torch.rand(head_dim, generator=gen) + 0.5 for _ in range(2)] if qk_norm else [None, None]
    positions = lengths.long().cpu() - 1
    inv_freq, amplitude = inverse_frequencies(head_dim, 10000.0, None)
    cos, sin = rope_cos_sin(inv_freq, amplitude, positions[:, None], dtype)  # [B, 1, D]
    key_norms = torch.zeros(batch, kv_heads, slots)
    on = {"device": k.device}
    return NewToken(qkv.to(dtype=dtype, **on), *(w if w is None else w.to(dtype=dtype, **on) for w in weights), 1e-6,
                    cos.to(**on), sin.to(**on), num_heads, kv_heads, k, v, key_norms.to(**on),
                    positions.to(dtype=lengths.dtype, **on))


def finished_first(token: NewToken):
    """The route it replaces, on copies of the caches: (q `[B, H_q, D]`, k, v, key_norms after the append)."""
    k, v, norms = token.k_cache.clone(), token.v_cache.clone(), token.key_norms.clone()
    q = layer_kernels.qk_norm_rope_append(token.qkv[:, None], token.q_weight, token.k_weight, token.eps, token.cos,
                                          token.sin, token.num_heads, token.num_kv_heads, k, v, norms,
                                          token.positions)
    return q[:, :, 0], k, v, norms


def poison_new_slots(token: NewToken) -> None:
    for b, slot in enumerate(token.positions.tolist()):
        token.k_cache[b, :, slot], token.v_cache[b, :, slot] = NEVER_READ_KEY, NEVER_READ_VALUE


def assert_appended_like(token: NewToken, k, v, norms, dtype) -> None:
    """The kernel's cache equals the reference route's: the new slot within rounding, the rest as it was."""
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(token.k_cache.double(), k.double(), rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(token.v_cache, v, rtol=0, atol=0, equal_nan=True)  # a copy: exact
    torch.testing.assert_close(token.key_norms, norms, rtol=tol, atol=tol)


CASES = [  # kv_heads, group, head_dim, width N, slots S, dtype, num_splits, seed, rows [(buffer, tail_start, L)]
    (2, 4, 128, 40, 300, torch.float32, 4, 1, [(0, 200, 300), (1, 250, 261), (DENSE, 0, 150)]),
    (3, 3, 64, 70, 257, torch.bfloat16, 3, 2, [(1, 180, 257), (0, 100, 90), (DENSE, 0, 257)]),  # empty tail
    (2, 2, 128, 50, 220, torch.bfloat16, 16, 4, [(0, 0, 1), (DENSE, 0, 1), (1, 60, 220)]),  # most splits empty
    (1, 1, 64, 90, 160, torch.float16, 1, 6, [(DENSE, 0, 160), (0, 158, 160)]),
]


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("one_loop", [False, True])
@pytest.mark.parametrize("kv_heads,group,head_dim,width,slots,dtype,num_splits,seed,rows", CASES)
def test_two_segment_finishes_the_new_token_like_the_reference_route(
        kv_heads, group, head_dim, width, slots, dtype, num_splits, seed, rows, one_loop, qk_norm):
    inputs = two_segment_inputs(kv_heads, group, head_dim, width, slots, dtype, seed, rows)
    token = new_token_for(inputs["k"], inputs["v"], inputs["lengths"], kv_heads * group, dtype, seed, qk_norm)
    q, k, v, norms = finished_first(token)
    poison_new_slots(token)
    inputs["q"] = token

    out = two_segment_decode(**inputs, num_splits=num_splits, one_loop=one_loop)

    reference, _ = two_segment_decode_reference(**{**inputs, "q": q, "k": k, "v": v})
    assert_matches(out, reference, dtype)
    assert_appended_like(token, k, v, norms, dtype)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_decode_finishes_the_new_token_like_the_reference_route(num_splits, dtype):
    gen = torch.Generator().manual_seed(num_splits)
    batch, kv_heads, group, slots, head_dim = 3, 2, 2, 200, 64
    k, v = (torch.randn(batch, kv_heads, slots, head_dim, generator=gen).to(device=DEVICE, dtype=dtype)
            for _ in range(2))
    lengths = torch.tensor([200, 1, 77], device=DEVICE)
    token = new_token_for(k, v, lengths, kv_heads * group, dtype, num_splits)
    q, k_ref, v_ref, norms = finished_first(token)
    poison_new_slots(token)

    out = dense_decode(token, k, v, lengths, num_splits)

    assert_matches(out, dense_decode_reference(q, k_ref, v_ref, lengths), dtype)
    assert_appended_like(token, k_ref, v_ref, norms, dtype)


def test_a_row_reading_nothing_still_appends():
    # A row whose compact segment and tail are both empty: no split reads a key, split 0 still appends.
    inputs = two_segment_inputs(1, 2, 64, 8, 40, torch.float32, 3, [(0, 30, 20)], poison=False)
    inputs["compact_counts"].zero_()
    token = new_token_for(inputs["k"], inputs["v"], inputs["lengths"], 2, torch.float32, 3)
    _, k, v, norms = finished_first(token)
    poison_new_slots(token)
    two_segment_decode(**{**inputs, "q": token}, num_splits=4)
    assert_appended_like(token, k, v, norms, torch.float32)


def test_a_token_that_does_not_fit_the_cache_is_refused():
    inputs = two_segment_inputs(2, 2, 64, 8, 40, torch.float32, 1, [(0, 10, 40)], poison=False)
    token = new_token_for(inputs["k"], inputs["v"], inputs["lengths"], 4, torch.float32, 1)
    wrong = NewToken(**{**token.__dict__, "num_kv_heads": 1})
    with pytest.raises(ValueError, match="does not fit a cache"):
        two_segment_decode(**{**inputs, "q": wrong})
    assert new_token.kernel_query(token) is token
