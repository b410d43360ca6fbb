"""Triton kernels for the small per-layer work around attention at decode: q/k post-processing and the
KV-cache append.

At decode every op here touches a few kilobytes, so what costs is the number of launches, not bytes.
`qk_norm_rope` replaces the four launches that normalise (Qwen3) and rotate q and k with one: a
program per (token, head) reads its head straight out of the stacked qkv projection, applies the
per-head RMSNorm and "rotate half" RoPE in float32, and writes q `[B, H_q, T, D]` or k
`[B, H_kv, T, D]`. `append_kv` replaces the five launches of the cache write (three scatters, a cast
and a norm) with one: a program per (sequence, KV head) copies the new key and value to slot
`positions[b]` and stores the key's float32 L2 norm.

Both read positions and weights from device memory and size their grids from static shapes only, so
they are CUDA-graph safe (launch each shape once before capture: the first call compiles). Their
torch references, which the CPU path runs, are `fused.qk_norm_rope` and `fused.append_kv`;
tests/test_fused_kernels.py checks the two against each other under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rope_head(src, dst, weight_ptr, cos_row, sin_row, eps,
                    HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Normalise (optionally) and rotate one head vector of HEAD_DIM elements from `src` into `dst`."""
    half = HEAD_DIM // 2
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < half
    first = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    second = tl.load(src + half + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        # Round where the reference does: the normalised vector to the model dtype, then the
        # product with the weight (HF's `weight * x.to(dtype)`).
        dtype = dst.dtype.element_ty
        inv_rms = tl.rsqrt((tl.sum(first * first, 0) + tl.sum(second * second, 0)) / HEAD_DIM + eps)
        w_first = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w_second = tl.load(weight_ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
        first = (w_first * (first * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        second = (w_second * (second * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    cos_first = tl.load(cos_row + offs, mask=mask, other=0.0).to(tl.float32)
    cos_second = tl.load(cos_row + half + offs, mask=mask, other=0.0).to(tl.float32)
    sin_first = tl.load(sin_row + offs, mask=mask, other=0.0).to(tl.float32)
    sin_second = tl.load(sin_row + half + offs, mask=mask, other=0.0).to(tl.float32)
    # rotate half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
    tl.store(dst + offs, (first * cos_first - second * sin_first).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + half + offs, (second * cos_second + first * sin_second).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, q_weight_ptr, k_weight_ptr, q_out_ptr, k_out_ptr,
                         stride_xb, stride_xt, stride_cb, stride_ct, stride_sb, stride_st,
                         stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                         seq_len, eps,
                         NUM_HEADS: tl.constexpr, HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0)
    head = tl.program_id(1)  # query heads first, then key heads: the qkv layout's order
    batch = (token // seq_len).to(tl.int64)
    t = (token % seq_len).to(tl.int64)
    src = qkv_ptr + batch * stride_xb + t * stride_xt + head * HEAD_DIM
    cos_row = cos_ptr + batch * stride_cb + t * stride_ct
    sin_row = sin_ptr + batch * stride_sb + t * stride_st
    if head < NUM_HEADS:
        dst = q_out_ptr + batch * stride_qb + head * stride_qh + t * stride_qt
        _norm_rope_head(src, dst, q_weight_ptr, cos_row, sin_row, eps, HAS_NORM, HEAD_DIM, BLOCK_HALF)
    else:
        dst = k_out_ptr + batch * stride_kb + (head - NUM_HEADS) * stride_kh + t * stride_kt
        _norm_rope_head(src, dst, k_weight_ptr, cos_row, sin_row, eps, HAS_NORM, HEAD_DIM, BLOCK_HALF)


def qk_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int):
    """q `[B, H_q, T, D]` and k `[B, H_kv, T, D]`, normalised (if weights are given) and rotated, from
    the stacked projection `qkv [B, T, (H_q + 2 H_kv) D]`; cos/sin `[B, T, D]` as rope.py makes them."""
    batch, seq, width = qkv.shape
    head_dim = cos.shape[-1]
    if width != (num_heads + 2 * num_kv_heads) * head_dim or head_dim % 2:
        raise ValueError(f"qkv of width {width} does not hold {num_heads} + 2 x {num_kv_heads} heads of "
                         f"(even) head_dim {head_dim}")
    if qkv.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("qkv, cos and sin need a contiguous last dimension")
    q = torch.empty(batch, num_heads, seq, head_dim, device=qkv.device, dtype=qkv.dtype)
    k = torch.empty(batch, num_kv_heads, seq, head_dim, device=qkv.device, dtype=qkv.dtype)
    has_norm = q_weight is not None
    _qk_norm_rope_kernel[(batch * seq, num_heads + num_kv_heads)](
        qkv, cos, sin, q_weight if has_norm else qkv, k_weight if has_norm else qkv, q, k,
        qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        seq, eps,
        NUM_HEADS=num_heads, HAS_NORM=has_norm, HEAD_DIM=head_dim,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2), num_warps=1,
    )
    return q, k


@triton.jit
def _append_kv_kernel(k_ptr, v_ptr, positions_ptr, k_cache_ptr, v_cache_ptr, norms_ptr,
                      stride_kb, stride_kh, stride_kd, stride_vb, stride_vh, stride_vd, stride_p,
                      stride_kcb, stride_kch, stride_kcs, stride_kcd,
                      stride_vcb, stride_vch, stride_vcs, stride_vcd,
                      stride_nb, stride_nh, stride_ns, n_slots,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    batch = tl.program_id(0).to(tl.int64)  # int64: offsets into a large cache exceed 2**31
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(positions_ptr + batch * stride_p).to(tl.int64)
    if (slot >= 0) & (slot < n_slots):  # a bad position never writes outside the cache
        offs = tl.arange(0, BLOCK_D)
        mask = offs < HEAD_DIM
        key = tl.load(k_ptr + batch * stride_kb + head * stride_kh + offs * stride_kd, mask=mask, other=0.0)
        value = tl.load(v_ptr + batch * stride_vb + head * stride_vh + offs * stride_vd, mask=mask, other=0.0)
        tl.store(k_cache_ptr + batch * stride_kcb + head * stride_kch + slot * stride_kcs + offs * stride_kcd,
                 key, mask=mask)
        tl.store(v_cache_ptr + batch * stride_vcb + head * stride_vch + slot * stride_vcs + offs * stride_vcd,
                 value, mask=mask)
        key32 = key.to(tl.float32)
        tl.store(norms_ptr + batch * stride_nb + head * stride_nh + slot * stride_ns,
                 tl.sqrt(tl.sum(key32 * key32, 0)))


def append_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, key_norms: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
    """Write k, v `[B, H_kv, D]` (any strides) at slot `positions[b]` of one layer's cache
    `[B, H_kv, S, D]`, and the float32 L2 norm of each key to `key_norms [B, H_kv, S]`."""
    batch, kv_heads, head_dim = k.shape
    if v.shape != k.shape or k_cache.shape[:2] != k.shape[:2] or k_cache.shape[3] != head_dim:
        raise ValueError(f"k, v {tuple(k.shape)}, {tuple(v.shape)} do not fit a cache of {tuple(k_cache.shape)}")
    if positions.shape != (batch,) or positions.device != k.device:
        raise ValueError(f"positions must be [B] = [{batch}] on {k.device}, got {tuple(positions.shape)} on "
                         f"{positions.device}")
    _append_kv_kernel[(batch, kv_heads)](
        k, v, positions, k_cache, v_cache, key_norms,
        *k.stride(), *v.stride(), positions.stride(0), *k_cache.stride(), *v_cache.stride(), *key_norms.stride(),
        k_cache.shape[2], HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), num_warps=1,
    )
