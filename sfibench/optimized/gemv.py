"""Decode's weight products as one Triton kernel each, with the small op before them folded in.

At decode a projection multiplies a few rows (one per sequence) by a weight matrix read once: a
matrix-vector product bound by the weight bytes. A step has four per layer, and before three of them
sits an elementwise op that is its own launch: the RMSNorm (with the residual add) before qkv and
gate_up, the gated activation (silu(gate) * up, or GeGLU) before down_proj. Those ops touch a few
kilobytes; their cost is the launch and the round trip of their output through memory. Here each
weight program recomputes its input from the op's own inputs instead, a "prologue":

- `norm`: x (+ residual), RMS-normalised and scaled by the norm weight. Every program first sums the
  squares of its rows (a few KB, from L2), then streams the weight. Program 0 also writes the
  residual sum, which the next layer adds to.
- `silu_mul` / `gelu_tanh_mul`: the activation of the stacked gate/up projection, per tile.

Every program owns BLOCK_N output columns and loops over K, BLOCK_K at a time: it loads a
[BLOCK_N, BLOCK_K] weight tile (rows are contiguous in K, so the loads coalesce), builds the matching
[BLOCK_M, BLOCK_K] input tile, and accumulates their product in float32 (`tl.dot`, rows padded to 16).
No split-K: the grid is N / BLOCK_N programs, several per SM at every projection of the models here.

The rounding follows the torch reference (models/fused.py): the residual sum and the normalised input
are rounded to the model dtype where the eager ops round them. Rows > MAX_ROWS (prefill) use the
reference: cuBLAS is the right kernel for a real matrix product. tests/test_gemv.py checks every
prologue against its reference under TRITON_INTERPRET=1; bench_gemv.py times the kernel against cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # decode: one row per sequence; more rows (prefill) go to cuBLAS
PROLOGUES = {"none": 0, "norm": 1, "add_norm": 2, "silu_mul": 3, "gelu_tanh_mul": 4}


@triton.jit
def _gelu_tanh(x):
    # gelu(x, approximate="tanh") = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); tanh(u) = 2 sigmoid(2u) - 1
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x * tl.sigmoid(2.0 * inner)


@triton.jit
def _gemv_kernel(x_ptr, residual_ptr, norm_weight_ptr, w_ptr, bias_ptr, y_ptr, residual_out_ptr,
                 rows, n_out, n_in, stride_x, stride_r, stride_w, stride_y, stride_ro, eps,
                 PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    dtype = y_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < rows
    col_ok = offs_n < n_out

    if PROLOGUE == 1 or PROLOGUE == 2:  # the RMS of each row first (of the residual sum with add_norm)
        squares = tl.zeros([BLOCK_M], tl.float32)
        for k0 in range(0, n_in, BLOCK_K):
            k = k0 + offs_k
            mask = row_ok[:, None] & (k < n_in)[None, :]
            x = tl.load(x_ptr + offs_m[:, None] * stride_x + k[None, :], mask=mask, other=0.0)
            if PROLOGUE == 2:
                x = x + tl.load(residual_ptr + offs_m[:, None] * stride_r + k[None, :], mask=mask, other=0.0)
            x = x.to(tl.float32)
            squares += tl.sum(x * x, 1)
        inv_rms = tl.rsqrt(squares / n_in + eps)

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, n_in, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < n_in
        mask = row_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + offs_n[:, None] * stride_w + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if PROLOGUE == 3 or PROLOGUE == 4:  # x is [gate | up]: activation(gate) * up, rounded as torch does
            gate = tl.load(x_ptr + offs_m[:, None] * stride_x + k[None, :], mask=mask, other=0.0).to(tl.float32)
            up = tl.load(x_ptr + offs_m[:, None] * stride_x + n_in + k[None, :], mask=mask, other=0.0)
            if PROLOGUE == 3:
                act = gate * tl.sigmoid(gate)
            else:
                act = _gelu_tanh(gate)
            x = (act.to(dtype).to(tl.float32) * up.to(tl.float32)).to(dtype)
        else:
            x = tl.load(x_ptr + offs_m[:, None] * stride_x + k[None, :], mask=mask, other=0.0)
            if PROLOGUE == 2:
                x = x + tl.load(residual_ptr + offs_m[:, None] * stride_r + k[None, :], mask=mask, other=0.0)
                if pid == 0:  # the residual stream the next layer adds to
                    tl.store(residual_out_ptr + offs_m[:, None] * stride_ro + k[None, :], x, mask=mask)
            if PROLOGUE == 1 or PROLOGUE == 2:
                normed = (x.to(tl.float32) * inv_rms[:, None]).to(dtype)
                scale = tl.load(norm_weight_ptr + k, mask=k_ok, other=0.0)
                x = (scale.to(tl.float32)[None, :] * normed.to(tl.float32)).to(dtype)
        acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_y + offs_n[None, :], acc.to(dtype),
             mask=row_ok[:, None] & col_ok[None, :])


def block_n_for(n_out: int, sm_count: int) -> int:
    """Output columns per program: the widest tile (fewer, longer weight streams) that still gives every SM
    at least two programs. A program's 16-64 rows x BLOCK_K weight tile is one coalesced load per step."""
    for block_n in (64, 32):
        if triton.cdiv(n_out, block_n) >= 2 * sm_count:
            return block_n
    return 16


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: any value tests the same code
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, prologue: str = "none",
         residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
         block_n: int | None = None, block_k: int = 256, num_warps: int = 4, num_stages: int = 3):
    """y = prologue(x) @ weight.T (+ bias) for x `[..., K]` (or `[..., 2K]` for gated prologues) with at
    most MAX_ROWS rows; weight `[N, K]`. With prologue "add_norm" returns (x + residual, y)."""
    if prologue not in PROLOGUES:
        raise ValueError(f"unknown prologue {prologue!r}; one of {sorted(PROLOGUES)}")
    n_out, n_in = weight.shape
    gated = prologue in ("silu_mul", "gelu_tanh_mul")
    width = 2 * n_in if gated else n_in
    if x.shape[-1] != width:
        raise ValueError(f"input width {x.shape[-1]} does not fit weight {tuple(weight.shape)} with prologue "
                         f"{prologue!r} (needs {width})")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)
    rows = x2.shape[0]
    if rows > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows (decode); got {rows}: use the reference")
    if x2.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight need a contiguous last dimension")
    if prologue in ("norm", "add_norm") and norm_weight is None:
        raise ValueError(f"prologue {prologue!r} needs norm_weight")
    y = torch.empty(rows, n_out, device=x.device, dtype=x.dtype)
    residual_out, residual2 = y, x2  # unused pointers unless add_norm
    if prologue == "add_norm":
        residual2 = residual.reshape(-1, n_in)
        if residual2.shape != x2.shape or residual2.stride(-1) != 1:
            raise ValueError(f"residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
        residual_out = torch.empty_like(x2)
    block_n = block_n or block_n_for(n_out, _sm_count(x.device))
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _gemv_kernel[(triton.cdiv(n_out, block_n),)](
        x2, residual2, norm_weight if norm_weight is not None else x2, weight, bias if bias is not None else weight,
        y, residual_out, rows, n_out, n_in, x2.stride(0), residual2.stride(0), weight.stride(0), y.stride(0),
        residual_out.stride(0), eps,
        PROLOGUE=PROLOGUES[prologue], HAS_BIAS=bias is not None, BLOCK_M=16, BLOCK_N=block_n,
        BLOCK_K=min(block_k, max(16, triton.next_power_of_2(n_in))), DOT_PRECISION=precision,
        num_warps=num_warps, num_stages=num_stages,
    )
    y = y.view(*lead, n_out)
    if prologue == "add_norm":
        return residual_out.view(*lead, n_in), y
    return y
