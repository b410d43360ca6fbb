"""Decode's weight products as Triton kernels, with the small op after them folded in.

At decode a projection multiplies a few rows (one per sequence) by a weight matrix read once: a
matrix-vector product bound by the weight bytes. cuBLAS reaches ~72% of copy bandwidth at the Qwen3-4B
shapes on an H200; this kernel, with a tile per shape (TUNED), 3-13% more (benchmarks/bench_gemv.py).
And a decode step is launch-bound around its products: after
two of them sits an elementwise op that is its own launch, reading what the product just wrote. Folded
in as an epilogue, it costs neither:

- `linear_add_rms_norm` (o_proj): y + residual is the new residual stream, and its RMSNorm (the
  post-attention norm) is the MLP's input. The norm needs whole rows, which no one program has, so
  every program writes its columns of the sum and counts itself done on an atomic counter; the last one
  to finish normalises the rows (as the attention kernels merge their splits, decode_attention.py).
  After down_proj the same epilogue measured slower than a separate kernel (decoder.py says by how much).
- `gate_up_activation` (gate_up_proj): a program computes the same columns of the gate and the up
  halves, so it can apply silu(gate) * up (or GeGLU) itself and write half the bytes.

Folding the norm into the *next* product's prologue instead (every program normalising its own copy of
the input) measured 5x slower: a dot operand computed in registers stops the weight loads pipelining.
So the norm folds (models/decoder.py fold_input_norms, on GPUs by default) leave both dot operands
loaded: the norm's weight lives in a copy of the next product's weight (qkv for the input norm, gate_up
for the post-attention norm), and the 1 / rms scales the product's output (`input_squares`, RMS_INPUT),
from partial sums of squares that the product before writes in its `add_squares` epilogue (down_proj,
o_proj), each program for its own columns: no program waits for another, unlike add_rms_norm's last one.

With programmatic dependent launch (pdl.py: on for the products where the GPU has it) the kernel may
start while the kernel before it finishes, and waits for it before its first load. The first weight tile
is loaded after that wait too: loading it before, which nothing forbids since no kernel writes weights,
measured slower at B = 5 and no faster at B = 1 on an H200.

Every program owns BLOCK_N output columns and loops over K, BLOCK_K at a time: a [BLOCK_N, BLOCK_K]
weight tile (rows are contiguous in K: the loads coalesce) times the [16, BLOCK_K] input tile (rows
padded to 16 for `tl.dot`), accumulated in float32. Rounding follows the torch references
(models/fused.py): the product is rounded to the model dtype before the op that follows, as F.linear's
output is. The grid is N / BLOCK_N programs, with no split-K, so a projection with few output columns
gets few programs: `decode_config` gives those (and prefill, rows > MAX_ROWS) to the references.
tests/kernels/test_gemv.py checks each function against its reference under TRITON_INTERPRET=1 and on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from sfibench.optimized import pdl

MAX_ROWS = 16  # decode: one row per sequence; more rows (prefill) go to cuBLAS
EPILOGUES = {"none": 0, "add_rms_norm": 1, "silu_mul": 2, "gelu_tanh_mul": 3, "add_squares": 4}


@dataclass(frozen=True)
class GemvConfig:
    block_n: int  # output columns per program (per half with a gated epilogue)
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


# Measured on an H200 (benchmarks/bench_gemv.py, bf16, 36 distinct weights per shape graphed, B = 1 and 5; keyed by
# (N, K) as the kernel sees them, a gated product by its stacked N): the best tile of a 3 x 3 x 2 x 2 grid.
# A shape with few programs wants more bytes in flight per program (BLOCK_K 512, 4 stages).
TUNED = {
    (6144, 2560): GemvConfig(64, 256),  # qwen3-4b qkv
    (2560, 4096): GemvConfig(32, 512),  # o_proj
    (19456, 2560): GemvConfig(32, 128, num_stages=3),  # gate_up: swept plain; gated, each half this wide
    (2560, 9728): GemvConfig(32, 512),  # down_proj
    (151936, 2560): GemvConfig(64, 256, num_stages=3),  # LM head
}
# Products with fewer programs than one per SM (N / 32 columns), e.g. qwen3-0.6b's o_proj and down_proj
# (1,024 columns), leave SMs idle on this kernel (it has no split-K), but on cuBLAS they would carry no
# epilogue: neither norm folds and o_proj's add + norm is a kernel of its own. Measured on an H200
# (qwen3-0.6b at 32K and 128K, B = 1 and 7), every graphed step ran faster with them here, so every decode
# product runs on this kernel.


def decode_config(rows: int, n_out: int, n_in: int, device: torch.device) -> GemvConfig | None:
    """The tile for a decode product of `rows` rows by an [N, K] weight, or None where the reference (cuBLAS)
    runs it: prefill, and CPU tensors outside the interpreter."""
    if rows > MAX_ROWS or (device.type != "cuda" and not _INTERPRETED):
        return None  # prefill; or CPU tensors outside the interpreter (fusion left on by a GPU session)
    if (n_out, n_in) in TUNED:
        return TUNED[(n_out, n_in)]
    few = n_out / 32 < 2 * _sm_count(device)
    return GemvConfig(32, 512 if few else 128, num_stages=4 if few else 3)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: any product is worth running through the kernel under test
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def _gelu_tanh(x):
    # gelu(x, approximate="tanh") = 0.5 x (1 + tanh(u)) with tanh(u) = 2 sigmoid(2u) - 1, i.e. x sigmoid(2u)
    return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))


@triton.jit
def _product_tile(x_ptr, w_ptr, n_out, n_in, stride_x, stride_w, offs_m, offs_n, row_ok, col_ok,
                  gated: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    """x `[BLOCK_M, K]` times the weight rows `offs_n` (and, gated, the up half's same rows), in float32."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # gated: the same columns of the up half
    pdl.wait_for_inputs(PDL)  # x is the kernel before's output
    for k0 in range(0, n_in, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < n_in
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + offs_n[:, None] * stride_w + k[None, :], mask=w_mask, other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
        if gated:  # the up half's rows start n_out rows further down the stacked weight
            w_up = tl.load(w_ptr + (offs_n + n_out)[:, None] * stride_w + k[None, :], mask=w_mask, other=0.0)
            acc_up += tl.dot(x, tl.trans(w_up), input_precision=DOT_PRECISION)
    return acc, acc_up


@triton.jit
def input_inv_rms(squares_ptr, n_partials, rows, n_in, eps, BLOCK_M: tl.constexpr):
    """1 / rms of each input row from the partial sums of squares `[n_partials, rows]` the kernel before
    wrote (linear_add_squares): the folded input norm's scale, applied to the product, not to the input."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_p = tl.arange(0, 32)
    total = tl.zeros([BLOCK_M], tl.float32)
    for p0 in range(0, n_partials, 32):
        part = p0 + offs_p
        tile = tl.load(squares_ptr + part[:, None] * rows + offs_m[None, :],
                       mask=(part < n_partials)[:, None] & (offs_m < rows)[None, :], other=0.0)
        total += tl.sum(tile, 0)
    return tl.rsqrt(total / n_in + eps)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, residual_ptr, norm_weight_ptr, normed_ptr, done_ptr,
                 squares_ptr, n_partials, rows, n_out, n_in, stride_x, stride_w, stride_y, stride_r, stride_n,
                 eps, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, RMS_INPUT: tl.constexpr,
                 OUTPUT_GAIN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_NORM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 PDL: tl.constexpr):
    pid = tl.program_id(0)
    dtype = x_ptr.dtype.element_ty  # the model's: every rounding below is F.linear's and the ops' after it
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < rows
    col_ok = offs_n < n_out
    gated: tl.constexpr = EPILOGUE == 2 or EPILOGUE == 3

    acc, acc_up = _product_tile(x_ptr, w_ptr, n_out, n_in, stride_x, stride_w, offs_m, offs_n, row_ok, col_ok,
                                gated, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, PDL)
    pdl.release_dependents(PDL)  # the epilogue's few stores overlap the next kernel's launch

    if RMS_INPUT:  # x is the raw residual stream; the weight carries the norm's weight (fold_input_norms)
        inv_rms = input_inv_rms(squares_ptr, n_partials, rows, n_in, eps, BLOCK_M)[:, None]
        acc = acc * inv_rms
        if gated:
            acc_up = acc_up * inv_rms
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dtype)  # F.linear's output, before the op that follows rounds it again
    out_mask = row_ok[:, None] & col_ok[None, :]
    if gated:
        gate = y.to(tl.float32)
        if EPILOGUE == 2:
            act = gate * tl.sigmoid(gate)
        else:
            act = _gelu_tanh(gate)
        y = (act.to(dtype).to(tl.float32) * acc_up.to(dtype).to(tl.float32)).to(dtype)
    if EPILOGUE == 1 or EPILOGUE == 4:  # y is the new residual stream: the product plus the old one
        y = (y + tl.load(residual_ptr + offs_m[:, None] * stride_r + offs_n[None, :], mask=out_mask,
                         other=0.0)).to(dtype)
    stored = y
    if OUTPUT_GAIN:  # the stream times a norm's weight, for a folded norm after it (linear_add_squares)
        gain = tl.load(norm_weight_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)
        stored = (y.to(tl.float32) * gain[None, :]).to(dtype)
    # A float32 output (the LM head's logits) holds the model-dtype values F.linear(...).float() would
    tl.store(y_ptr + offs_m[:, None] * stride_y + offs_n[None, :], stored.to(y_ptr.dtype.element_ty),
             mask=out_mask)
    if EPILOGUE == 4:
        # Each program's share of every row's sum of squares, for the next product's folded norm: no
        # program waits for another, the next kernel adds the shares up.
        stored = tl.where(out_mask, y.to(tl.float32), 0.0)
        tl.store(squares_ptr + pid * rows + offs_m, tl.sum(stored * stored, 1), mask=row_ok)
    if EPILOGUE == 1:
        # The last program to finish normalises whole rows. The barrier orders every thread's stores
        # before the counter's release; the last program reads the sums past L1 (.cg).
        tl.debug_barrier()
        if tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            _rms_norm_rows(y_ptr, norm_weight_ptr, normed_ptr, rows, n_out, stride_y, stride_n, eps,
                           BLOCK_M, BLOCK_NORM)
            tl.store(done_ptr, 0)  # zero again for the next launch or graph replay


@triton.jit
def _rms_norm_rows(x_ptr, weight_ptr, out_ptr, rows, width, stride_x, stride_out, eps,
                   BLOCK_M: tl.constexpr, BLOCK_NORM: tl.constexpr):
    """out = weight * (x / rms(x)) per row, rounded where fused.rms_norm rounds."""
    dtype = out_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs = tl.arange(0, BLOCK_NORM)
    row_ok = offs_m < rows
    squares = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(0, width, BLOCK_NORM):
        mask = row_ok[:, None] & (c0 + offs < width)[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + (c0 + offs)[None, :], mask=mask, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        squares += tl.sum(x * x, 1)
    inv_rms = tl.rsqrt(squares / width + eps)
    for c0 in range(0, width, BLOCK_NORM):
        cols_ok = c0 + offs < width
        mask = row_ok[:, None] & cols_ok[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + (c0 + offs)[None, :], mask=mask, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        scale = tl.load(weight_ptr + c0 + offs, mask=cols_ok, other=0.0).to(tl.float32)
        normed = (x * inv_rms[:, None]).to(dtype).to(tl.float32)
        tl.store(out_ptr + offs_m[:, None] * stride_out + (c0 + offs)[None, :], (scale[None, :] * normed).to(dtype),
                 mask=mask)


_INTERPRETED = isinstance(_gemv_kernel, InterpretedFunction)  # as decode_attention.py tells

_done_counters: dict[torch.device, torch.Tensor] = {}


def _done_counter(device: torch.device) -> torch.Tensor:
    """The add_rms_norm epilogue's finish counter: zero between launches (the last program resets it), so
    one per device serves every launch on one stream, graphed or not. (Two such launches running at once
    on two streams would share it: only the decoder's stream calls them.)"""
    if device not in _done_counters:
        _done_counters[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _done_counters[device]


SHARED_MEMORY_BUDGET = 200 * 1024  # bytes of pipelined tiles per program (an H100/H200 block has 227 KB)


def fit_shared_memory(config: GemvConfig, n_in: int, weight_tiles: int, itemsize: int) -> GemvConfig:
    """`config` with BLOCK_K clamped to K and, where its pipeline stages (an input tile and `weight_tiles`
    weight tiles each) would not fit in shared memory, fewer stages, then narrower tiles."""
    block_k = min(config.block_k, max(16, triton.next_power_of_2(n_in)))
    stages = config.num_stages
    while stages * (MAX_ROWS + weight_tiles * config.block_n) * block_k * itemsize > SHARED_MEMORY_BUDGET:
        if stages > 2:
            stages -= 1
        else:
            block_k //= 2
    return GemvConfig(config.block_n, block_k, config.num_warps, stages)


def _launch(x2, weight, bias, y, epilogue: str, config: GemvConfig, n_out: int,
            residual=None, norm_weight=None, normed=None, eps: float = 0.0, squares=None,
            input_squares=None, output_gain=None) -> None:
    rows, n_in = x2.shape
    if x2.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight need a contiguous last dimension")
    gated = epilogue in ("silu_mul", "gelu_tanh_mul")
    config = fit_shared_memory(config, n_in, 2 if gated else 1, x2.element_size())
    unused = y  # pointer arguments an epilogue does not touch
    launch = pdl.launch_options(x2.device, "products")
    _gemv_kernel[(triton.cdiv(n_out, config.block_n),)](
        x2, weight, bias if bias is not None else unused, y, residual if residual is not None else unused,
        next(w for w in (norm_weight, output_gain, unused) if w is not None),  # a norm's weight, or the gain
        normed if normed is not None else unused,
        _done_counter(x2.device), *_squares_args(squares, input_squares, y),
        rows, n_out, n_in, x2.stride(0), weight.stride(0), y.stride(0),
        residual.stride(0) if residual is not None else 0, normed.stride(0) if normed is not None else 0, eps,
        EPILOGUE=EPILOGUES[epilogue], HAS_BIAS=bias is not None, RMS_INPUT=input_squares is not None,
        OUTPUT_GAIN=output_gain is not None, BLOCK_M=MAX_ROWS, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        BLOCK_NORM=min(1024, triton.next_power_of_2(n_out)),
        DOT_PRECISION="ieee" if x2.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages, **launch,
    )


def _squares_args(squares, input_squares, unused) -> tuple:
    """The kernel's (squares pointer, partial count): written by add_squares, read by a folded norm."""
    for partials in (squares, input_squares):
        if partials is not None:
            return partials, partials.shape[0]
    return unused, 0


def check_input_squares(input_squares: torch.Tensor, rows: int) -> None:
    if input_squares.dtype != torch.float32 or input_squares.dim() != 2 or input_squares.shape[1] != rows \
            or not input_squares.is_contiguous():
        raise ValueError(f"input_squares must be contiguous float32 [partials, rows] with rows = {rows}, got "
                         f"{input_squares.dtype} {tuple(input_squares.shape)}")


def _rows(x: torch.Tensor, width: int, weight: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] != width:
        raise ValueError(f"input width {x.shape[-1]} does not fit weight {tuple(weight.shape)} (needs {width})")
    if x.dtype != weight.dtype:
        raise ValueError(f"input dtype {x.dtype} differs from the weight's {weight.dtype}")
    return x.reshape(-1, width)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: GemvConfig | None = None, *, input_squares: torch.Tensor | None = None,
           input_eps: float = 0.0, out_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """F.linear(x, weight, bias) for x `[..., K]` in one Triton launch; None at shapes the kernel does not serve
    (decode_config gives no tile: prefill, cuBLAS-sized products), which models/fused.py runs itself.
    With `input_squares` (partial sums of squares of x's rows, `[partials, rows]`) x is an un-normalised
    residual stream and the product is scaled by its 1 / rms (fused.linear's folded input norm).
    `out_dtype`: the product, rounded to x's dtype as F.linear's is, then stored as this type (the LM
    head's float32 logits, without a conversion kernel after it)."""
    n_out, n_in = weight.shape
    x2 = _rows(x, n_in, weight)
    if input_squares is not None:
        check_input_squares(input_squares, x2.shape[0])
    config = config or decode_config(x2.shape[0], n_out, n_in, x.device)
    if config is None:
        return None
    y = torch.empty(x2.shape[0], n_out, device=x.device, dtype=out_dtype or x.dtype)
    _launch(x2, weight, bias, y, "none", config, n_out, eps=input_eps, input_squares=input_squares)
    return y.view(*x.shape[:-1], n_out)


def linear_add_squares(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                       config: GemvConfig | None = None, *,
                       output_gain: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """fused.linear_add_squares: (F.linear(x, weight) + residual, its rows' partial sums of squares); with
    `output_gain` the first is that sum times the gain (the squares stay the sum's). None where the kernel
    does not serve the shape or the residual's layout."""
    n_out, n_in = weight.shape
    x2 = _rows(x, n_in, weight)
    config = config or decode_config(x2.shape[0], n_out, n_in, x.device)
    if config is None or residual.shape != (*x.shape[:-1], n_out) or residual.stride(-1) != 1:
        return None
    if output_gain is not None and output_gain.shape != (n_out,):
        raise ValueError(f"output_gain must be [N] = [{n_out}], got {tuple(output_gain.shape)}")
    residual2 = residual.reshape(-1, n_out)
    summed = torch.empty_like(residual2)
    programs = triton.cdiv(n_out, config.block_n)
    squares = torch.empty(programs, x2.shape[0], device=x.device, dtype=torch.float32)
    _launch(x2, weight, None, summed, "add_squares", config, n_out, residual2, squares=squares,
            output_gain=output_gain)
    return summed.view(residual.shape), squares


def linear_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                        eps: float, config: GemvConfig | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """fused.add_rms_norm(F.linear(x, weight), residual, norm_weight, eps): (the new residual, its norm); None
    at shapes the kernel does not serve."""
    n_out, n_in = weight.shape
    x2 = _rows(x, n_in, weight)
    config = config or decode_config(x2.shape[0], n_out, n_in, x.device)
    if config is None:
        return None
    if residual.shape != (*x.shape[:-1], n_out):
        raise ValueError(f"residual {tuple(residual.shape)} must be [..., N] = {[*x.shape[:-1], n_out]}")
    residual2 = residual.reshape(-1, n_out)
    if residual2.stride(-1) != 1:
        raise ValueError("the residual needs a contiguous last dimension")
    summed, normed = torch.empty_like(residual2), torch.empty_like(residual2)
    _launch(x2, weight, None, summed, "add_rms_norm", config, n_out, residual2, norm_weight, normed, eps)
    return summed.view(residual.shape), normed.view(residual.shape)


def gate_up_activation(x: torch.Tensor, weight: torch.Tensor, activation: str,
                       config: GemvConfig | None = None, *, input_squares: torch.Tensor | None = None,
                       input_eps: float = 0.0) -> torch.Tensor | None:
    """fused.<activation>(F.linear(x, weight)) for the stacked gate/up weight `[2I, K]`: `[..., I]`.
    With `input_squares` the post-attention norm is folded in, as in `linear`: both halves are scaled. None at
    shapes the kernel does not serve."""
    if activation not in ("silu_mul", "gelu_tanh_mul"):
        raise ValueError(f"unknown activation {activation!r}; silu_mul or gelu_tanh_mul")
    n_stacked, n_in = weight.shape
    x2 = _rows(x, n_in, weight)
    if input_squares is not None:
        check_input_squares(input_squares, x2.shape[0])
    config = config or decode_config(x2.shape[0], n_stacked, n_in, x.device)
    if config is None:
        return None
    y = torch.empty(x2.shape[0], n_stacked // 2, device=x.device, dtype=x.dtype)
    _launch(x2, weight, None, y, activation, config, n_stacked // 2, eps=input_eps,
            input_squares=input_squares)
    return y.view(*x.shape[:-1], n_stacked // 2)
