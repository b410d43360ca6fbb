"""The qkv projection with the q/k norm, RoPE and the KV-cache append as its epilogue: one launch, not two.

At decode the layer's first two kernels are gemv.py's qkv product and layer_kernels.py's
qk_norm_rope_append, which reads the product straight back. Here the product's kernel does both. The
norm and RoPE need a whole head (RMS over its HEAD_DIM values, "rotate half" pairs i with i + HEAD_DIM/2)
while a program owns BLOCK_N <= HEAD_DIM columns, so as in gemv's add_rms_norm epilogue every program
stores its columns and counts itself done, here on a counter per head: the head's last program to
finish reads the head back for every row and finishes it (a q head: normalised and rotated into q; a
k head: the same into cache slot positions[b], with the key's norm; a v head: copied to the cache). The
tails run in parallel, one per head, where gemv's add_rms_norm after down_proj had one program normalise
whole rows alone (measured slower, decoder.py).

Fused decoding always uses it (models/fused.py): on an H200, qwen3-4b at 32K, it took 0.02 ms off every
method's step at B = 1 and 5 against the two launches.
tests/kernels/test_qkv_epilogue.py checks it against its reference, fused.qk_norm_rope_append(F.linear(...)),
under TRITON_INTERPRET=1 and on CUDA.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from sfibench.optimized import gemv, pdl
from sfibench.optimized.layer_kernels import check_append_inputs

@triton.jit
def _finish_head(qkv_ptr, head, rows, stride_qkv, cos_ptr, sin_ptr, stride_cb, stride_sb, q_weight_ptr, k_weight_ptr,
                 q_ptr, stride_qb, stride_qh, k_cache_ptr, v_cache_ptr, norms_ptr, positions_ptr,
                 stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_nb, stride_nh, stride_ns,
                 stride_p, n_slots, eps, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                 HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """One head of every row, from the stored product to q or the cache, rounded where the reference rounds
    (fused.qk_norm_rope_append: the norm in float32, cast, times the weight, cast; RoPE in float32, cast).
    layer_kernels._norm_rope_head does the same for one (token, head); here all rows of the head are one
    [rows, HEAD_DIM / 2] tile, so the tail costs one round trip to memory rather than one per row."""
    dtype = qkv_ptr.dtype.element_ty
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, HALF)
    row_ok = offs_m < rows
    batch = offs_m.to(tl.int64)
    src = qkv_ptr + batch[:, None] * stride_qkv + head * HEAD_DIM + offs_h[None, :]
    # .cg: past L1, which may hold lines of this buffer from an earlier launch
    first = tl.load(src, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
    second = tl.load(src + HALF, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
    slot = tl.load(positions_ptr + batch * stride_p, mask=row_ok, other=-1).to(tl.int64)
    in_cache = (row_ok & (slot >= 0) & (slot < n_slots))[:, None]  # a bad position writes nothing
    if head >= NUM_HEADS + NUM_KV_HEADS:  # a value head: copied as it is
        dst = v_cache_ptr + batch[:, None] * stride_vb + (head - NUM_HEADS - NUM_KV_HEADS) * stride_vh \
            + slot[:, None] * stride_vs + offs_h[None, :]
        tl.store(dst, first, mask=in_cache)
        tl.store(dst + HALF, second, mask=in_cache)
    else:
        is_query = head < NUM_HEADS
        # New names: Triton wants a variable to keep its type across the branches.
        x_first = first.to(tl.float32)
        x_second = second.to(tl.float32)
        if HAS_NORM:
            if is_query:
                weight_ptr = q_weight_ptr
            else:
                weight_ptr = k_weight_ptr
            inv_rms = tl.rsqrt((tl.sum(x_first * x_first, 1) + tl.sum(x_second * x_second, 1)) / HEAD_DIM + eps)
            w_first = tl.load(weight_ptr + offs_h).to(tl.float32)
            w_second = tl.load(weight_ptr + HALF + offs_h).to(tl.float32)
            normed_first = (x_first * inv_rms[:, None]).to(dtype).to(tl.float32)
            normed_second = (x_second * inv_rms[:, None]).to(dtype).to(tl.float32)
            x_first = (w_first[None, :] * normed_first).to(dtype).to(tl.float32)
            x_second = (w_second[None, :] * normed_second).to(dtype).to(tl.float32)
        cos_row = cos_ptr + batch[:, None] * stride_cb + offs_h[None, :]
        sin_row = sin_ptr + batch[:, None] * stride_sb + offs_h[None, :]
        cos_first = tl.load(cos_row, mask=row_ok[:, None], other=0.0).to(tl.float32)
        cos_second = tl.load(cos_row + HALF, mask=row_ok[:, None], other=0.0).to(tl.float32)
        sin_first = tl.load(sin_row, mask=row_ok[:, None], other=0.0).to(tl.float32)
        sin_second = tl.load(sin_row + HALF, mask=row_ok[:, None], other=0.0).to(tl.float32)
        out_first = (x_first * cos_first - x_second * sin_first).to(dtype)
        out_second = (x_second * cos_second + x_first * sin_second).to(dtype)
        if is_query:
            dst = q_ptr + batch[:, None] * stride_qb + head * stride_qh + offs_h[None, :]
            tl.store(dst, out_first, mask=row_ok[:, None])
            tl.store(dst + HALF, out_second, mask=row_ok[:, None])
        else:
            kv_head = head - NUM_HEADS
            dst = k_cache_ptr + batch[:, None] * stride_kb + kv_head * stride_kh + slot[:, None] * stride_ks \
                + offs_h[None, :]
            tl.store(dst, out_first, mask=in_cache)
            tl.store(dst + HALF, out_second, mask=in_cache)
            stored_first, stored_second = out_first.to(tl.float32), out_second.to(tl.float32)
            norm = tl.sqrt(tl.sum(stored_first * stored_first, 1) + tl.sum(stored_second * stored_second, 1))
            tl.store(norms_ptr + batch[:, None] * stride_nb + kv_head * stride_nh + slot[:, None] * stride_ns,
                     norm[:, None], mask=in_cache)


@triton.jit
def _qkv_append_kernel(x_ptr, w_ptr, bias_ptr, qkv_ptr, counter_ptr, cos_ptr, sin_ptr, q_weight_ptr, k_weight_ptr,
                       q_ptr, k_cache_ptr, v_cache_ptr, norms_ptr, positions_ptr, squares_ptr, n_partials,
                       input_eps,
                       rows, n_out, n_in, stride_x, stride_w, stride_qkv, stride_cb, stride_sb, stride_qb, stride_qh,
                       stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_nb, stride_nh,
                       stride_ns, stride_p, n_slots, eps,
                       NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HAS_NORM: tl.constexpr,
                       HAS_BIAS: tl.constexpr, RMS_INPUT: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < rows
    col_ok = offs_n < n_out
    acc, _ = gemv._product_tile(x_ptr, w_ptr, n_out, n_in, stride_x, stride_w, offs_m, offs_n, row_ok, col_ok,
                                False, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, PDL)
    pdl.release_dependents(PDL)
    if RMS_INPUT:  # the folded input norm (gemv.input_inv_rms)
        acc = acc * gemv.input_inv_rms(squares_ptr, n_partials, rows, n_in, input_eps, BLOCK_M)[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(qkv_ptr + offs_m[:, None] * stride_qkv + offs_n[None, :], acc.to(qkv_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])
    # The head's last program to finish completes it. The barrier orders every thread's stores before the
    # counter's release (as in gemv's add_rms_norm epilogue).
    PARTS: tl.constexpr = HEAD_DIM // BLOCK_N
    head = pid // PARTS
    tl.debug_barrier()
    if tl.atomic_add(counter_ptr + head, 1, sem="acq_rel", scope="gpu") == PARTS - 1:
        _finish_head(qkv_ptr, head, rows, stride_qkv, cos_ptr, sin_ptr, stride_cb, stride_sb, q_weight_ptr,
                     k_weight_ptr, q_ptr, stride_qb, stride_qh, k_cache_ptr, v_cache_ptr, norms_ptr, positions_ptr,
                     stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_nb, stride_nh, stride_ns,
                     stride_p, n_slots, eps, NUM_HEADS, NUM_KV_HEADS, HAS_NORM, HEAD_DIM, BLOCK_M)
        tl.store(counter_ptr + head, 0)  # zero again for the next launch or graph replay


@functools.cache
def _head_counters(device: torch.device, heads: int) -> torch.Tensor:
    """Per-head finish counters, zero between launches (each head's last program resets its own); one buffer
    per device and head count, shared by every layer's launch in stream order."""
    return torch.zeros(heads, dtype=torch.int32, device=device)


def linear_qk_norm_rope_append(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                               cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                               k_cache: torch.Tensor, v_cache: torch.Tensor, key_norms: torch.Tensor,
                               positions: torch.Tensor, config: gemv.GemvConfig | None = None, *,
                               input_squares: torch.Tensor | None = None, input_eps: float = 0.0) -> torch.Tensor | None:
    """fused.qk_norm_rope_append(F.linear(x, weight, bias), ...) for decode's x `[B, 1, K]`: q `[B, H_q, 1, D]`,
    the new k and v appended at slot positions[b]. None at shapes the kernel does not serve (prefill-sized
    batches, products cuBLAS is better at, a tile that does not divide the head): models/fused.py runs
    those as two launches."""
    n_out, n_in = weight.shape
    head_dim = cos.shape[-1]
    x2 = gemv._rows(x, n_in, weight)
    config = config or gemv.decode_config(x2.shape[0], n_out, n_in, x.device)
    if config is not None:
        config = replace(config, block_n=min(config.block_n, head_dim))
    if config is None or head_dim % config.block_n or x.shape[1] != 1 \
            or n_out != (num_heads + 2 * num_kv_heads) * head_dim:
        return None
    batch = x.shape[0]
    if input_squares is not None:
        gemv.check_input_squares(input_squares, batch)
    check_append_inputs(batch, num_kv_heads, head_dim, x.device, k_cache, v_cache, key_norms, positions)
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("cos and sin need a contiguous last dimension")
    config = gemv.fit_shared_memory(config, n_in, 1, x2.element_size())
    qkv = torch.empty(batch, n_out, device=x.device, dtype=x.dtype)
    q = torch.empty(batch, num_heads, 1, head_dim, device=x.device, dtype=x.dtype)
    has_norm = q_weight is not None
    _qkv_append_kernel[(n_out // config.block_n,)](
        x2, weight, bias if bias is not None else qkv, qkv, _head_counters(x.device, n_out // head_dim), cos, sin,
        q_weight if has_norm else qkv, k_weight if has_norm else qkv, q, k_cache, v_cache, key_norms, positions,
        input_squares if input_squares is not None else qkv,
        input_squares.shape[0] if input_squares is not None else 0, input_eps,
        batch, n_out, n_in, x2.stride(0), weight.stride(0), qkv.stride(0), cos.stride(0), sin.stride(0),
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], *key_norms.stride(),
        positions.stride(0), k_cache.shape[2], eps,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HAS_NORM=has_norm, HAS_BIAS=bias is not None,
        RMS_INPUT=input_squares is not None,
        HEAD_DIM=head_dim, BLOCK_M=gemv.MAX_ROWS, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl.launch_options(x.device, "products"),
    )
    return q

