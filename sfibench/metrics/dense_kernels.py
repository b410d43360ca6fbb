"""SPEC section 6's dense-kernel check: the Triton decode-attention kernel against every PyTorch SDPA backend.

SPEC requires the dense baseline to be as good as the best dense decode kernel on the machine; a
throughput run with --dense-kernels records this comparison at its own shapes (runners/throughput.py),
and benchmarks/bench_attention.py runs it standalone with further variants. One layer's attention for
one decode step: q `[B, H_q, D]` over K/V `[B, H_kv, L, D]`.

How it times: each kernel is captured in a CUDA graph (as the engine runs decode steps; a kernel that
cannot be captured is timed eagerly and marked so) and replayed under `triton.testing.do_bench`,
which clears the L2 cache before every call. So K/V that would fit in L2 (B = 1 at 8K is 33 MB, the
H200's L2 50 MB) still come from HBM, as they do in a real step where other layers ran in between.
Bytes counted: K and V read once plus q and the output. A backend that refuses GQA is re-run on K/V
expanded per query head; the expand is excluded from its time and reported beside it (it reads and
writes G times the K/V bytes, so it is not free). CUDA only.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from sfibench.optimized.decode_attention import default_config, default_num_splits, dense_decode

SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def capture(fn):
    """(callable to time, output tensor it fills, graphed?): a CUDA graph replay when capture works."""
    fn()  # compile, autotune, allocate workspaces: none of that may happen inside a capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = fn()
        return graph.replay, out, True
    except RuntimeError:
        torch.cuda.synchronize()
        return fn, None, False


def prepare(kernel: str, fn, nbytes: int) -> dict:
    """Compile and capture one kernel; a kernel that refuses the shape gets ran=False and its reasons."""
    row = {"kernel": kernel, "bytes": nbytes}
    with warnings.catch_warnings(record=True) as caught:  # SDPA explains a refusal in warnings
        warnings.simplefilter("always")
        try:
            run, out, graphed = capture(fn)
        except (RuntimeError, ValueError, NotImplementedError) as error:
            reasons = [str(w.message).splitlines()[0] for w in caught] + [str(error).splitlines()[0]]
            torch.cuda.synchronize()
            return {**row, "ran": False, "error": "; ".join(reasons)[:500]}
    return {**row, "ran": True, "graphed": graphed, "_run": run, "_out": fn() if out is None else out}


def measure(prepared: list[dict], reference: torch.Tensor | None, rounds: int) -> list[dict]:
    """Time the prepared kernels in interleaved rounds, so clock or thermal drift hits all of them alike.

    Per kernel: ms_median is the median of the rounds' medians, ms_min/ms_max the extremes over all
    timed calls, round_medians the spread between rounds.
    """
    timed = [row for row in prepared if row["ran"]]
    for row in timed:
        row["round_medians"], row["ms_min"], row["ms_max"] = [], float("inf"), 0.0
    for _ in range(rounds):
        for row in timed:
            low, median, high = triton.testing.do_bench(row["_run"], quantiles=[0.0, 0.5, 1.0])
            row["round_medians"].append(median)
            row["ms_min"], row["ms_max"] = min(row["ms_min"], low), max(row["ms_max"], high)
    for row in timed:
        out = row.pop("_out").reshape(-1).float()
        row.pop("_run")
        row["ms_median"] = statistics.median(row["round_medians"])
        row["gb_s"] = row["bytes"] / (row["ms_median"] * 1e-3) / 1e9
        if reference is not None:
            row["max_abs_diff_vs_triton"] = (out - reference).abs().max().item()
    return prepared


def _alternatives(batch: int, kv_heads: int, head_dim: int, context: int, dtype: torch.dtype,
                  device) -> dict[str, dict]:
    """dense_decode settings around the static defaults, to check those defaults on the machine."""
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    splits = default_num_splits(batch, kv_heads, context, sm_count)
    config = default_config(head_dim, dtype)
    named = {f"num_splits={n}": {"num_splits": n} for n in (max(1, splits // 2), 2 * splits)}
    for block_n in (config.block_n // 2, 2 * config.block_n):
        named[f"block_n={block_n}"] = {"config": replace(config, block_n=block_n)}
    named["num_warps=8"] = {"config": replace(config, num_warps=8)}
    named["num_stages=2"] = {"config": replace(config, num_stages=2)}
    return {f"triton split-K, {name}": kwargs for name, kwargs in named.items()}


def random_decode_inputs(batch, kv_heads, group, head_dim, context, dtype, device):
    """Seeded q `[B, H_q, D]`, K/V `[B, H_kv, L, D]` full to `context`, the bytes one call reads, the shape."""
    torch.manual_seed(0)
    q = torch.randn(batch, kv_heads * group, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, kv_heads, context, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    lengths = torch.full((batch,), context, device=device, dtype=torch.int32)
    nbytes = (2 * k.numel() + 2 * q.numel()) * k.element_size()  # K and V once, plus q and the output
    shape = {"batch": batch, "kv_heads": kv_heads, "group": group, "head_dim": head_dim, "context": context,
             "dtype": str(dtype).removeprefix("torch.")}
    return q, k, v, lengths, nbytes, shape


def benchmark_dense(batch: int, kv_heads: int, group: int, head_dim: int, context: int,
                    dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda",
                    sweep: bool = False, rounds: int = 3) -> list[dict]:
    """Rows for our dense_decode (also on a cache twice the context) and each SDPA backend, timed in
    `rounds` interleaved rounds. `sweep` adds dense_decode with its split count, tile and warps varied.
    """
    q, k, v, lengths, nbytes, shape = random_decode_inputs(batch, kv_heads, group, head_dim, context, dtype, device)

    reference = dense_decode(q, k, v, lengths).reshape(-1).float()
    candidates = {"triton split-K": lambda: dense_decode(q, k, v, lengths)}
    if sweep:
        for name, kwargs in _alternatives(batch, kv_heads, head_dim, context, dtype, device).items():
            candidates[name] = partial(dense_decode, q, k, v, lengths, **kwargs)
    # A static cache holds more slots than the context; the tail past `lengths` must cost nothing.
    k_long, v_long = (torch.cat([t, torch.empty_like(t)], dim=2) for t in (k, v))
    candidates["triton split-K, cache 2L"] = partial(dense_decode, q, k_long, v_long, lengths)
    q_sdpa = q.unsqueeze(2)

    def sdpa(backend, key=k, value=v, gqa=True):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q_sdpa, key, value, enable_gqa=gqa)

    for name, backend in SDPA_BACKENDS.items():
        candidates[f"sdpa {name}"] = partial(sdpa, backend)
    rows = measure([prepare(name, fn, nbytes) for name, fn in candidates.items()], reference, rounds)
    del candidates, k_long, v_long  # the closures hold the 2L cache: free it before expanding K/V

    # A backend that refuses GQA, re-run on K/V expanded per query head (after the others: G x memory).
    for name, backend in SDPA_BACKENDS.items():
        if group == 1 or next(r for r in rows if r["kernel"] == f"sdpa {name}")["ran"]:
            continue
        k_wide, v_wide = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        expand = triton.testing.do_bench(lambda: (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)),
                                         return_mode="median")
        fn = partial(sdpa, backend, k_wide, v_wide, False)
        row = measure([prepare(f"sdpa {name}, K/V expanded", fn, nbytes)], reference, 1)[0]
        row.update(expand_ms_median=expand, note="expand excluded from ms; the kernel reads G x the K/V bytes counted")
        rows.append(row)
        del k_wide, v_wide
    torch.cuda.empty_cache()
    return [{**shape, **row} for row in rows]
