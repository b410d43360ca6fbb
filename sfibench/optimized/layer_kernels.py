"""Triton kernels for the small per-layer work around attention at decode: q/k post-processing and the
KV-cache append.

At decode every op here touches a few kilobytes, so what costs is the number of launches, not bytes.
`qk_norm_rope` replaces the four launches that normalise (Qwen3) and rotate q and k with one: a
program per (token, head) reads its head straight out of the stacked qkv projection, applies the
per-head RMSNorm and "rotate half" RoPE in float32, and writes q `[B, H_q, T, D]` or k
`[B, H_kv, T, D]`. `append_kv` replaces the five launches of the cache write (three scatters, a cast
and a norm) with one: a program per (sequence, KV head) copies the new key and value to slot
`positions[b]` and stores the key's float32 L2 norm. At decode `qk_norm_rope_append` does both in one
launch: the key heads' programs write the rotated key straight into the cache slot (with its norm) and
extra programs copy the value heads, so the step has one launch per layer fewer and no k in between.
`decode_inputs` is a folded decode step's first launch: each token's embedding row, its float32 sum of
squares (the first layer's folded input norm) and its RoPE cos/sin row from rope.PositionTable, where
torch takes five launches.

The q/k kernel launches with programmatic dependent launch where the GPU has it (pdl.py). All read
positions and weights from device memory and size their grids from static shapes only, so
they are CUDA-graph safe (launch each shape once before capture: the first call compiles). Their
torch references, which the CPU path runs, are the functions of the same names in models/fused.py;
tests/kernels/test_layer_kernels.py checks each pair against each other under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sfibench.optimized import pdl


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
    out_first = (first * cos_first - second * sin_first).to(dst.dtype.element_ty)
    out_second = (second * cos_second + first * sin_second).to(dst.dtype.element_ty)
    tl.store(dst + offs, out_first, mask=mask)
    tl.store(dst + half + offs, out_second, mask=mask)
    return out_first.to(tl.float32), out_second.to(tl.float32)  # as stored, for the key's norm


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, q_weight_ptr, k_weight_ptr, q_out_ptr, k_out_ptr,
                         v_out_ptr, norms_ptr, positions_ptr,
                         stride_xb, stride_xt, stride_cb, stride_ct, stride_sb, stride_st,
                         stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                         stride_vb, stride_vh, stride_vt, stride_nb, stride_nh, stride_nt, stride_p, n_slots,
                         seq_len, eps,
                         NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HAS_NORM: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr, APPEND: tl.constexpr,
                         PDL: tl.constexpr):
    pdl.wait_for_inputs(PDL)  # qkv is the kernel before's output
    pdl.release_dependents(PDL)  # tiny: let the attention kernel launch and load what it can meanwhile
    token = tl.program_id(0)
    head = tl.program_id(1)  # query heads first, then key heads (then value heads with APPEND): qkv's order
    batch = (token // seq_len).to(tl.int64)
    t = (token % seq_len).to(tl.int64)
    src = qkv_ptr + batch * stride_xb + t * stride_xt + head * HEAD_DIM
    cos_row = cos_ptr + batch * stride_cb + t * stride_ct
    sin_row = sin_ptr + batch * stride_sb + t * stride_st
    if APPEND:  # k and v go straight to cache slot positions[b]; a bad position writes nothing
        slot = tl.load(positions_ptr + batch * stride_p).to(tl.int64)
        in_cache = (slot >= 0) & (slot < n_slots)
    else:
        slot = t
        in_cache = t >= 0
    if head < NUM_HEADS:
        dst = q_out_ptr + batch * stride_qb + head * stride_qh + t * stride_qt
        _norm_rope_head(src, dst, q_weight_ptr, cos_row, sin_row, eps, HAS_NORM, HEAD_DIM, BLOCK_HALF)
    elif head < NUM_HEADS + NUM_KV_HEADS:
        if in_cache:
            kv_head = head - NUM_HEADS
            dst = k_out_ptr + batch * stride_kb + kv_head * stride_kh + slot * stride_kt
            first, second = _norm_rope_head(src, dst, k_weight_ptr, cos_row, sin_row, eps, HAS_NORM, HEAD_DIM,
                                            BLOCK_HALF)
            if APPEND:  # the stored key's float32 L2 norm, as append_kv keeps it
                tl.store(norms_ptr + batch * stride_nb + kv_head * stride_nh + slot * stride_nt,
                         tl.sqrt(tl.sum(first * first, 0) + tl.sum(second * second, 0)))
    elif in_cache:  # a value head (APPEND only): copied as it is
        offs = tl.arange(0, 2 * BLOCK_HALF)
        mask = offs < HEAD_DIM
        value = tl.load(src + offs, mask=mask)
        kv_head = head - NUM_HEADS - NUM_KV_HEADS
        tl.store(v_out_ptr + batch * stride_vb + kv_head * stride_vh + slot * stride_vt + offs, value, mask=mask)


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
    _launch_qk_norm_rope(qkv, q_weight, k_weight, eps, cos, sin, num_heads, num_kv_heads, q, k)
    return q, k


def qk_norm_rope_append(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                        cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, key_norms: torch.Tensor,
                        positions: torch.Tensor) -> torch.Tensor:
    """Decode (one token per sequence): qk_norm_rope and append_kv in one launch; returns q `[B, H_q, 1, D]`.

    The key heads write their rotated key straight to slot `positions[b]` of `k_cache [B, H_kv, S, D]`
    (and its norm to `key_norms [B, H_kv, S]`), and value heads copy theirs to `v_cache`: one launch
    where a decode step had two, with no intermediate k. The same values as the two, up to the
    summation order of the key's norm."""
    batch, seq, _ = qkv.shape
    head_dim = cos.shape[-1]
    if seq != 1:
        raise ValueError(f"qk_norm_rope_append appends one token per sequence; got {seq}")
    check_append_inputs(batch, num_kv_heads, head_dim, qkv.device, k_cache, v_cache, key_norms, positions)
    q = torch.empty(batch, num_heads, 1, head_dim, device=qkv.device, dtype=qkv.dtype)
    _launch_qk_norm_rope(qkv, q_weight, k_weight, eps, cos, sin, num_heads, num_kv_heads, q, k_cache,
                         (v_cache, key_norms, positions))
    return q


def check_append_inputs(batch: int, num_kv_heads: int, head_dim: int, device: torch.device, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, key_norms: torch.Tensor, positions: torch.Tensor) -> None:
    """The cache and positions a decode append writes to: [B, H_kv, S, D] caches, [B] positions on `device`."""
    if k_cache.shape != (batch, num_kv_heads, k_cache.shape[2], head_dim) or v_cache.shape != k_cache.shape \
            or key_norms.shape != k_cache.shape[:3]:
        raise ValueError(f"caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)}, norms {tuple(key_norms.shape)} "
                         f"do not hold [B, H_kv, S, D] = [{batch}, {num_kv_heads}, S, {head_dim}]")
    if positions.shape != (batch,) or positions.device != device:
        raise ValueError(f"positions must be [B] = [{batch}] on {device}, got {tuple(positions.shape)} on "
                         f"{positions.device}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the caches need a contiguous last dimension")


def _launch_qk_norm_rope(qkv, q_weight, k_weight, eps, cos, sin, num_heads, num_kv_heads, q, k, append=None):
    """One program per (token, head); with `append` = (v_cache, key_norms, positions), k is the key cache
    and the value heads get programs too."""
    batch, seq, _ = qkv.shape
    head_dim = cos.shape[-1]
    has_norm = q_weight is not None
    v, norms, positions = append if append is not None else (q, q, q)  # unused pointers without APPEND
    v_strides = v.stride()[:3] if append is not None else (0, 0, 0)
    n_strides = norms.stride() if append is not None else (0, 0, 0)
    _qk_norm_rope_kernel[(batch * seq, num_heads + num_kv_heads * (2 if append is not None else 1))](
        qkv, cos, sin, q_weight if has_norm else qkv, k_weight if has_norm else qkv, q, k, v, norms, positions,
        qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        *v_strides, *n_strides, positions.stride(0) if append is not None else 0,
        k.shape[2] if append is not None else 0, seq, eps,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HAS_NORM=has_norm, HEAD_DIM=head_dim,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2), APPEND=append is not None, num_warps=1,
        **pdl.launch_options(qkv.device, "products"),
    )


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


@triton.jit
def _decode_inputs_kernel(tokens_ptr, positions_ptr, embedding_ptr, table_ptr, x_ptr, squares_ptr, pair_ptr,
                          stride_t, stride_p, stride_e, stride_table, vocab, n_positions,
                          HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr, PAIR: tl.constexpr,
                          BLOCK_PAIR: tl.constexpr):
    # x `[rows, HIDDEN]` and pair `[rows, PAIR]` are this launcher's own contiguous outputs
    row = tl.program_id(0).to(tl.int64)
    token = tl.load(tokens_ptr + row * stride_t).to(tl.int64)
    position = tl.load(positions_ptr + row * stride_p).to(tl.int64)
    # An id or position outside the tables reads nothing and gives zeros: a wrong answer, never a stray read.
    token_ok = (token >= 0) & (token < vocab)
    position_ok = (position >= 0) & (position < n_positions)
    offs = tl.arange(0, BLOCK_H)
    in_row = offs < HIDDEN
    x = tl.load(embedding_ptr + token * stride_e + offs, mask=offs < tl.where(token_ok, HIDDEN, 0), other=0.0)
    tl.store(x_ptr + row * HIDDEN + offs, x, mask=in_row)
    x32 = x.to(tl.float32)
    tl.store(squares_ptr + row, tl.sum(x32 * x32, 0))
    offs_pair = tl.arange(0, BLOCK_PAIR)  # cos then sin: one contiguous [2, D] row of the table
    in_pair = offs_pair < PAIR
    pair = tl.load(table_ptr + position * stride_table + offs_pair,
                   mask=offs_pair < tl.where(position_ok, PAIR, 0), other=0.0)
    tl.store(pair_ptr + row * PAIR + offs_pair, pair, mask=in_pair)


def decode_inputs(tokens: torch.Tensor, positions: torch.Tensor, embedding: torch.Tensor,
                  table: torch.Tensor):
    """fused.decode_inputs in one launch, one program per token: the embedding row, its float32 sum of squares
    and the RoPE table's [2, D] row (`tokens`, `positions` `[B, T]`; table `[N, 2, D]` contiguous per row).
    Returns x `[B, T, H]`, squares `[1, B T]`, cos and sin `[B, T, D]` (views of one `[B, T, 2, D]`
    buffer)."""
    batch, seq = tokens.shape
    vocab, hidden = embedding.shape
    if positions.shape != tokens.shape or table.dim() != 3 or table.shape[1] != 2:
        raise ValueError(f"decode_inputs takes tokens and positions of one shape [B, T] and a table "
                         f"[N, 2, D]; got {tuple(tokens.shape)}, {tuple(positions.shape)}, "
                         f"{tuple(table.shape)}")
    if embedding.stride(1) != 1 or table.stride(2) != 1 or table.stride(1) != table.shape[2]:
        raise ValueError("decode_inputs needs contiguous embedding rows and [2, D] table rows")
    rows = batch * seq
    flat_tokens, flat_positions = tokens.reshape(rows), positions.reshape(rows)
    x = torch.empty(batch, seq, hidden, device=embedding.device, dtype=embedding.dtype)
    squares = torch.empty(1, rows, device=embedding.device, dtype=torch.float32)
    pair = torch.empty(batch, seq, 2, table.shape[2], device=table.device, dtype=table.dtype)
    _decode_inputs_kernel[(rows,)](
        flat_tokens, flat_positions, embedding, table, x, squares, pair, flat_tokens.stride(0),
        flat_positions.stride(0), embedding.stride(0), table.stride(0), vocab, table.shape[0], HIDDEN=hidden,
        BLOCK_H=triton.next_power_of_2(hidden), PAIR=2 * table.shape[2],
        BLOCK_PAIR=triton.next_power_of_2(2 * table.shape[2]), num_warps=4)
    return x, squares, pair[..., 0, :], pair[..., 1, :]
