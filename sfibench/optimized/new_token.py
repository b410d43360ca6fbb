"""The step's new token finished inside the attention kernel: q/k RMSNorm, RoPE and the cache append.

At decode the qkv product is followed by work that needs whole heads: Qwen3's per-head RMSNorm of q and k,
"rotate half" RoPE (element i pairs with i + D/2) and the append of the new k and v to the cache. The qkv
product's programs own a few columns each, so its epilogue (qkv_epilogue.py) stores the product, counts
finished programs per head, and the head's last program reads the head back and finishes it: a round trip
to memory and a counter that the weights floor's plain GEMV does not pay (~1.4 us a layer at qwen3-0.6b's
shape on an H200, reports/attention-h200/session16).

The attention kernel's programs already own whole heads: each serves the G query heads of one KV head. So
with a `fused.NewToken` in place of q, each program loads its G raw query heads from the product and
normalises and rotates them in registers, and the one program whose split holds the step's own slot (the
last index of its sequence and KV head: exactly one per pair) finishes the new key the same way, copies the
value, writes both and the key's norm to the cache, and only then reads its tiles. The qkv product becomes
the plain GEMV the floor times. Rounding follows fused.qk_norm_rope_append step by step (the norm in float32,
cast, times the weight, cast; RoPE in float32, cast), so q and the cached k are the same values.

decode_attention.py and two_segment.py call these from their split kernels (NEW_TOKEN); tests/test_new_token.py
checks both against fused.NewToken.finish followed by the float64 attention oracles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sfibench.models.fused import NewToken
from sfibench.switches import read_switch

ENV = "SFIBENCH_QKV_IN_ATTENTION"
CHOICES = {"1": "q/k norm, RoPE and the append in the attention kernel (the qkv product a plain GEMV)",
           "0": "in the qkv product's epilogue (qkv_epilogue.py)"}


def in_attention() -> bool:
    """Whether the optimized methods take the step's raw qkv product (SFIBENCH_QKV_IN_ATTENTION, default 1)."""
    return read_switch(ENV, CHOICES, "1") == "1"


def describe() -> str:
    """For reports: where the new token's q/k are finished in this process."""
    mode = read_switch(ENV, CHOICES, "1")
    return f"{CHOICES[mode]} ({ENV}={mode})"


def kernel_query(q: torch.Tensor | NewToken) -> torch.Tensor | NewToken:
    """What a method's attend hands the split kernels: q `[B, H_q, 1, D]` as `[B, H_q, D]`, or the NewToken."""
    return q if isinstance(q, NewToken) else q[:, :, 0]


def split_query(q: torch.Tensor | NewToken) -> tuple[NewToken | None, torch.Tensor]:
    """(the token or None, the query heads `[B, H_q, D]`): with a token, a view of its raw product's query heads,
    whose strides (row, head, element) also reach the key and value heads after them."""
    if not isinstance(q, NewToken):
        return None, q
    batch, head_dim = q.qkv.shape[0], q.cos.shape[-1]
    return q, q.qkv.view(batch, -1, head_dim)[:, :q.num_heads]


def launch_arguments(token: NewToken | None, placeholder: torch.Tensor) -> tuple[tuple, dict]:
    """The split kernels' new-token arguments (pointers and strides, then constexprs); `placeholder` stands
    in for every pointer when there is no token (never read: NEW_TOKEN is off)."""
    if token is None:
        return (placeholder,) * 6 + (0,) * 6 + (0.0,), {"NEW_TOKEN": False, "HAS_NORM": False}
    has_norm = token.q_weight is not None
    if token.cos.stride(-1) != 1 or token.sin.stride(-1) != 1:
        raise ValueError("the new token's cos and sin need a contiguous last dimension")
    cos, sin = token.cos.reshape(token.cos.shape[0], -1), token.sin.reshape(token.sin.shape[0], -1)
    pointers = (cos, sin, token.q_weight if has_norm else cos, token.k_weight if has_norm else cos,
                token.key_norms, token.positions)
    strides = (cos.stride(0), sin.stride(0), *token.key_norms.stride(), token.positions.stride(0))
    return pointers + strides + (token.eps,), {"NEW_TOKEN": True, "HAS_NORM": has_norm}


@triton.jit
def _rotate(x, partner, offs_d, cos, sin, weight, weight_partner, eps,
            HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr, dtype: tl.constexpr):
    """Rows of raw heads `x` ([..., HEAD_DIM] float32) normalised and rotated, rounded as the reference rounds;
    `partner` holds each element's rotate-half partner (element (i + HEAD_DIM/2) mod HEAD_DIM)."""
    if HAS_NORM:
        inv_rms = tl.rsqrt(tl.sum(x * x, -1) / HEAD_DIM + eps)
        x = (weight * (x * tl.expand_dims(inv_rms, -1)).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        partner = (weight_partner * (partner * tl.expand_dims(inv_rms, -1)).to(dtype).to(tl.float32)) \
            .to(dtype).to(tl.float32)
    # rotate half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), the same two products and one sum per element
    first_half = offs_d < HEAD_DIM // 2
    return tl.where(first_half, x * cos - partner * sin, x * cos + partner * sin).to(dtype)


@triton.jit
def appends(split, start, end, n_keys):
    """Whether this split appends the new k/v: the one whose keys [start, end) end with the row's last key (the
    step's own slot), or split 0 when the row reads no keys at all, so that every step appends exactly once."""
    return (end == n_keys) & ((start < end) | (split == 0))


@triton.jit
def finish_queries(qkv_ptr, seq, kv_head, stride_qb, stride_qh, stride_qd, cos_ptr, sin_ptr, stride_cos,
                   stride_sin, q_weight_ptr, eps,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
                   DOT_IN_FP32: tl.constexpr):
    """The G query heads of one KV head from the raw product `[B, heads, D]`, normalised and rotated: a
    [BLOCK_G, D] tile as decode_attention._load_group_queries gives it, padding rows zero."""
    dtype = qkv_ptr.dtype.element_ty
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    partner_d = (offs_d + HEAD_DIM // 2) % HEAD_DIM
    rows = qkv_ptr + seq * stride_qb + (kv_head * GROUP + offs_g)[:, None] * stride_qh
    valid = (offs_g < GROUP)[:, None]
    x = tl.load(rows + offs_d[None, :] * stride_qd, mask=valid, other=0.0).to(tl.float32)
    partner = tl.load(rows + partner_d[None, :] * stride_qd, mask=valid, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + seq * stride_cos + offs_d).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + seq * stride_sin + offs_d).to(tl.float32)[None, :]
    if HAS_NORM:
        weight = tl.load(q_weight_ptr + offs_d).to(tl.float32)[None, :]
        weight_partner = tl.load(q_weight_ptr + partner_d).to(tl.float32)[None, :]
    else:
        weight, weight_partner = cos, cos  # unused
    q = _rotate(x, partner, offs_d[None, :], cos, sin, weight, weight_partner, eps, HAS_NORM, HEAD_DIM, dtype)
    q = tl.where(valid, q, 0.0)
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    return q


@triton.jit
def append_new_key_value(qkv_ptr, seq, kv_head, stride_qb, stride_qh, stride_qd, cos_ptr, sin_ptr, stride_cos,
                         stride_sin, k_weight_ptr, eps, k_head, v_head, stride_ks, stride_kd, stride_vs, stride_vd,
                         norms_ptr, stride_nb, stride_nh, stride_ns, positions_ptr, stride_pos, n_slots,
                         q_heads, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    """The new key (normalised and rotated) and value of one (sequence, KV head) from the raw product, written
    to cache slot positions[seq] with the key's float32 norm; a position outside the cache writes nothing.
    Ends with a block-wide barrier, so this program's later tile loads see the slot."""
    dtype = qkv_ptr.dtype.element_ty
    offs_d = tl.arange(0, HEAD_DIM)[None, :]  # a [1, D] row, the shape _rotate's norm reduces
    partner_d = (offs_d + HEAD_DIM // 2) % HEAD_DIM
    key_row = qkv_ptr + seq * stride_qb + (q_heads + kv_head) * stride_qh
    value_row = key_row + tl.num_programs(1) * stride_qh  # the value heads follow all KV heads' keys
    x = tl.load(key_row + offs_d * stride_qd).to(tl.float32)
    partner = tl.load(key_row + partner_d * stride_qd).to(tl.float32)
    value = tl.load(value_row + offs_d * stride_qd)
    cos = tl.load(cos_ptr + seq * stride_cos + offs_d).to(tl.float32)
    sin = tl.load(sin_ptr + seq * stride_sin + offs_d).to(tl.float32)
    if HAS_NORM:
        weight = tl.load(k_weight_ptr + offs_d).to(tl.float32)
        weight_partner = tl.load(k_weight_ptr + partner_d).to(tl.float32)
    else:
        weight, weight_partner = cos, cos  # unused
    key = _rotate(x, partner, offs_d, cos, sin, weight, weight_partner, eps, HAS_NORM, HEAD_DIM, dtype)
    slot = tl.load(positions_ptr + seq * stride_pos).to(tl.int64)
    if (slot >= 0) & (slot < n_slots):
        tl.store(k_head + slot * stride_ks + offs_d * stride_kd, key)
        tl.store(v_head + slot * stride_vs + offs_d * stride_vd, value)
        stored = key.to(tl.float32)
        norm = tl.sqrt(tl.sum(stored * stored))
        tl.store(norms_ptr + seq * stride_nb + kv_head * stride_nh + slot * stride_ns, norm)
    tl.debug_barrier()  # every thread's stores land before any thread loads the slot back


def check_new_token(token: NewToken, k: torch.Tensor) -> None:
    """The token's shapes against the layer's cache `[B, H_kv, S, D]` the kernel appends to."""
    batch, kv_heads, slots, head_dim = k.shape
    if token.num_kv_heads != kv_heads or token.qkv.shape != (batch, (token.num_heads + 2 * kv_heads) * head_dim):
        raise ValueError(f"the new token's qkv {tuple(token.qkv.shape)} ({token.num_heads} + 2 x "
                         f"{token.num_kv_heads} heads) does not fit a cache of {tuple(k.shape)}")
    if token.key_norms.shape != (batch, kv_heads, slots) or token.positions.shape != (batch,):
        raise ValueError(f"key_norms must be [B, H_kv, S] = {[batch, kv_heads, slots]} and positions [B], got "
                         f"{tuple(token.key_norms.shape)} and {tuple(token.positions.shape)}")
    if token.qkv.stride(-1) != 1:
        raise ValueError("the new token's qkv needs a contiguous last dimension")
    if triton.next_power_of_2(head_dim) != head_dim:
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
