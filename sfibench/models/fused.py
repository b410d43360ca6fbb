"""The small ops of a decode step, in plain torch, and their fused versions for GPU decode.

At decode each op touches a few kilobytes, so a step is launch-bound: measured on an H200 with the
qwen3-0.6b shape at 8K, a CUDA-graph replay of the unfused step ran ~1,500 kernels in 4.7 ms against a
0.57 ms byte roofline. Every function here is pure (weights and caches are arguments) and is the
reference its fused version is checked against. `ops` is what the decoder and the cache call: plain
torch by default (CPU, tests); `enable_fusion()`, called when a model is loaded for decode (which records
the choice on the loaded model as a `DecodeKernels`), switches GPU runs to one kernel per op, the
normalisations and the gated activations (SwiGLU, GeGLU) compiled by torch.compile (one compilation
serves every layer), the q/k post-processing and the cache append as the Triton kernels of
optimized/layer_kernels.py, and decode's weight products as optimized/gemv.py's kernel, the residual
add + norm after o_proj and the gated activation after gate_up folded into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 like the reference implementations, then cast back before scaling.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(x + residual, its RMSNorm): the residual add and the next norm in one pass."""
    summed = x + residual
    return summed, rms_norm(summed, weight, eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [B, H, T, D]` by cos/sin `[B, T, D]` ("rotate half" layout of HF checkpoints)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def qk_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int):
    """q `[B, H_q, T, D]` and k `[B, H_kv, T, D]` from the stacked projection `qkv [B, T, (H_q + 2 H_kv) D]`:
    each head RMS-normalised when weights are given (Qwen3), then rotated by cos/sin `[B, T, D]`."""
    batch, seq, _ = qkv.shape
    heads = qkv.view(batch, seq, -1, cos.shape[-1])
    q, k = heads[:, :, :num_heads], heads[:, :, num_heads:num_heads + num_kv_heads]
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    return apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on the stacked projection `[..., 2 I]`: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU's activation (Gemma) on the stacked projection `[..., 2 I]`: gelu_tanh(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def append_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, key_norms: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
    """Write k, v `[B, H_kv, D]` at slot `positions[b]` of one layer's cache `[B, H_kv, S, D]`, and the
    float32 L2 norm of each key to `key_norms [B, H_kv, S]`."""
    index = positions.view(-1, 1, 1, 1).expand(-1, k.shape[1], 1, k.shape[2])
    k_cache.scatter_(2, index, k.unsqueeze(2))
    v_cache.scatter_(2, index, v.unsqueeze(2))
    key_norms.scatter_(2, index[..., 0], k.float().norm(dim=-1).unsqueeze(2))


def qk_norm_rope_append(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                        eps: float, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, key_norms: torch.Tensor,
                        positions: torch.Tensor) -> torch.Tensor:
    """Decode, one token per sequence: qk_norm_rope, then the new k and v appended to one layer's cache
    at slot positions[b] (append_kv). Returns q `[B, H_q, 1, D]`; fused, one launch does both."""
    q, k = qk_norm_rope(qkv, q_weight, k_weight, eps, cos, sin, num_heads, num_kv_heads)
    v = qkv.view(qkv.shape[0], -1, cos.shape[-1])[:, num_heads + num_kv_heads:]
    append_kv(k_cache, v_cache, key_norms, positions, k[:, :, 0], v)
    return q


def decode_inputs(tokens: torch.Tensor, positions: torch.Tensor, embedding: torch.Tensor,
                  table: torch.Tensor):
    """A folded decode step's first inputs: the embeddings `[B, T, H]` of `tokens [B, T]`, their rows' float32
    sums of squares `[1, B T]` (the first layer's folded input norm, Decoder.fold_input_norms) and cos, sin
    `[B, T, D]` gathered from a rope.PositionTable `table [N, 2, D]` at `positions [B, T]`. Fused, one launch
    (optimized/layer_kernels.decode_inputs) where this is five."""
    x = F.embedding(tokens, embedding)
    pair = table[positions]
    return x, x.float().pow(2).sum(-1).reshape(1, -1), pair[..., 0, :], pair[..., 1, :]


def linear_qk_norm_rope_append(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                               cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                               k_cache: torch.Tensor, v_cache: torch.Tensor, key_norms: torch.Tensor,
                               positions: torch.Tensor, *, input_squares: torch.Tensor | None = None,
                               input_eps: float = 0.0) -> torch.Tensor:
    """Decode's qkv projection, then qk_norm_rope_append: q `[B, H_q, 1, D]`, k and v appended. Fused, the
    two are one launch (optimized/qkv_epilogue.py), except at shapes its kernel does not serve.
    `input_squares`/`input_eps`: the folded input norm, as in `linear`."""
    qkv = ops["linear"](x, weight, bias, input_squares=input_squares, input_eps=input_eps)
    return ops["qk_norm_rope_append"](qkv, q_weight, k_weight, eps, cos, sin, num_heads, num_kv_heads,
                                      k_cache, v_cache, key_norms, positions)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           input_squares: torch.Tensor | None = None, input_eps: float = 0.0,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A projection: F.linear. Fused, decode-sized ones run optimized/gemv.py's kernel.

    With `input_squares` the input norm is folded in (Decoder.fold_input_norms): x is the raw residual
    stream, `weight` already carries the norm's weight, and the product in float32 is scaled by each
    row's 1 / rms, computed from the partial sums of squares `[partials, rows]` the kernel before wrote.
    `out_dtype`: the result (in x's dtype, as F.linear's) converted to it."""
    if input_squares is None:
        y = F.linear(x, weight, bias)
    else:
        inv_rms = torch.rsqrt(input_squares.sum(0) / x.shape[-1] + input_eps).view(*x.shape[:-1], 1)
        y = F.linear(x.float(), weight.float()) * inv_rms
        y = (y if bias is None else y + bias.float()).to(x.dtype)
    return y if out_dtype is None else y.to(out_dtype)


def linear_add_squares(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                       output_gain: torch.Tensor | None = None):
    """down_proj with the residual add, when the next input norm is folded into the next product: (the new
    residual stream, its rows' sums of squares as one partial `[1, rows]`). Fused, one launch.

    `output_gain` (the last layer's, with the final norm folded into the LM head, whose vocabulary-wide
    weight is not worth a copy with the gain in it as qkv's is): the stream comes back multiplied by the
    norm's weight, and the squares stay the stream's."""
    summed = F.linear(x, weight) + residual
    squares = summed.float().pow(2).sum(-1).reshape(1, -1)
    return (summed if output_gain is None else output_gain * summed), squares


def linear_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                        eps: float):
    """o_proj, then the residual add and the post-attention norm: (the new residual, its RMSNorm)."""
    return add_rms_norm(F.linear(x, weight), residual, norm_weight, eps)


def gate_up_activation(x: torch.Tensor, weight: torch.Tensor, activation: str, *,
                       input_squares: torch.Tensor | None = None, input_eps: float = 0.0) -> torch.Tensor:
    """The MLP's stacked gate/up projection and its gated activation (`silu_mul` or `gelu_tanh_mul`).
    `input_squares`/`input_eps`: the post-attention norm folded in, as the input norm is in `linear`."""
    return EAGER[activation](linear(x, weight, input_squares=input_squares, input_eps=input_eps))


EAGER = {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "qk_norm_rope": qk_norm_rope, "silu_mul": silu_mul,
         "gelu_tanh_mul": gelu_tanh_mul, "append_kv": append_kv, "qk_norm_rope_append": qk_norm_rope_append,
         "linear": linear, "linear_add_rms_norm": linear_add_rms_norm, "gate_up_activation": gate_up_activation,
         "linear_qk_norm_rope_append": linear_qk_norm_rope_append, "linear_add_squares": linear_add_squares,
         "decode_inputs": decode_inputs}
# The RoPE table (rope.rope_cos_sin) is not compiled: compiled cos/sin of float32 angles up to the context
# length were never checked against eager on a GPU. On a GPU the decoder gathers it from rope.PositionTable
# instead (the same launch count, eager values).
COMPILED = ("rms_norm", "add_rms_norm", "silu_mul", "gelu_tanh_mul")
ops = dict(EAGER)


def _add_rms_norm_after(x, weight, residual, norm_weight, eps):
    return ops["add_rms_norm"](F.linear(x, weight), residual, norm_weight, eps)


def _gate_up_after(x, weight, activation, *, input_squares=None, input_eps=0.0):
    if input_squares is None:
        return ops[activation](F.linear(x, weight))
    return gate_up_activation(x, weight, activation, input_squares=input_squares, input_eps=input_eps)


def _kernel_or(kernel, reference):
    """`kernel` where it serves the shape, else `reference` (a kernel answers None for shapes it does not
    serve: optimized/ knows nothing of these references). `.kernel` names the kernel for reports."""
    def op(*args, **kwargs):
        out = kernel(*args, **kwargs)
        return reference(*args, **kwargs) if out is None else out

    op.kernel = kernel
    op.__name__ = op.__qualname__ = kernel.__name__
    op.__doc__ = kernel.__doc__
    return op


def kernel_ops() -> dict:
    """The decode ops that run a Triton kernel, each falling back to its reference at shapes the kernel
    does not serve (the weight products at prefill or cuBLAS-sized shapes)."""
    from sfibench.optimized import gemv, layer_kernels, qkv_epilogue

    return {
        "qk_norm_rope": layer_kernels.qk_norm_rope,
        "append_kv": layer_kernels.append_kv,
        "qk_norm_rope_append": layer_kernels.qk_norm_rope_append,
        "decode_inputs": layer_kernels.decode_inputs,
        "linear": _kernel_or(gemv.linear, linear),
        "linear_add_rms_norm": _kernel_or(gemv.linear_add_rms_norm, _add_rms_norm_after),
        "gate_up_activation": _kernel_or(gemv.gate_up_activation, _gate_up_after),
        "linear_add_squares": _kernel_or(gemv.linear_add_squares, linear_add_squares),
        "linear_qk_norm_rope_append": _kernel_or(qkv_epilogue.linear_qk_norm_rope_append,
                                                 linear_qk_norm_rope_append),
    }


def enable_fusion(enabled: bool = True) -> None:
    """Route the step's small ops through their fused versions (or back to plain torch).

    For CUDA tensors (or the Triton interpreter): the Triton kernels do not run on plain CPU tensors.
    Compiled per static shape (best kernels): a run meets a few dozen shapes (prefill chunks, each
    batch size), more than dynamo's default of 8 recompilations, so the limit is raised.
    """
    ops.update(EAGER)
    if not enabled:
        return
    import torch._dynamo

    for limit in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 128))
    for name in COMPILED:
        ops[name] = torch.compile(EAGER[name], fullgraph=True, dynamic=False)
    ops.update(kernel_ops())


@dataclass(frozen=True)
class DecodeKernels:
    """The kernels a loaded model decodes with, chosen when it is loaded (loading.load_for_decode) and
    recorded in a run's results.json. `fused`: the step's small ops run their fused versions
    (enable_fusion); `norms_folded`: the input and post-attention norms were folded into the qkv and gate_up
    products (Decoder.fold_input_norms)."""

    fused: bool = False
    norms_folded: bool = False

    def decode_gemv(self) -> str:
        """The kernels of decode's weight products, in words."""
        if not self.fused:
            return "cuBLAS (F.linear)"
        described = ("Triton (optimized/gemv.py: o_proj + residual add + norm, unless folded below, and "
                     "gate_up + activation as epilogues; cuBLAS for prefill); qkv + q/k norm, RoPE and the KV "
                     "append in one kernel (optimized/qkv_epilogue.py)")
        if self.norms_folded:
            described += ("; input norms folded into the qkv products, down_proj + residual add + sums of "
                          "squares; post-attention norms folded into gate_up, o_proj + residual add + sums of "
                          "squares")
        return described
