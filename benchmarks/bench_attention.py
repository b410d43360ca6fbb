"""Decode-attention microbenchmark: the split-K Triton kernel against every PyTorch SDPA backend.

One layer's attention for one decode step: q `[B, H_q, D]` over K/V `[B, H_kv, L, D]`. SPEC section 6
requires the dense baseline to be as good as the best dense decode kernel on the machine; this is
where that is checked.

How it times: each kernel is captured in a CUDA graph (as the engine runs decode steps; a kernel that
cannot be captured is timed eagerly and marked so) and replayed under `triton.testing.do_bench`,
which clears the L2 cache before every call. So K/V that would fit in L2 (B = 1 at 8K is 33 MB, the
H200's L2 50 MB) still come from HBM, as they do in a real step where other layers ran in between.
Bytes counted: K and V read once plus q and the output. A backend that refuses GQA is re-run on K/V
expanded per query head; the expand is excluded from its time and reported beside it (it reads and
writes G times the K/V bytes, so it is not free).

    python -m sfibench.optimized.bench_attention --out attention.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from sfibench.metrics.timing import measure_copy_bandwidth
from sfibench.optimized.decode_attention import default_config, default_num_splits, dense_decode
from sfibench.optimized.two_segment import two_segment_decode

SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
QWEN3_4B = {"kv_heads": 8, "group": 4, "head_dim": 128, "dtype": torch.bfloat16}


def _graphed(fn):
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


def _prepare(kernel: str, fn, nbytes: int) -> dict:
    """Compile and capture one kernel; a kernel that refuses the shape gets ran=False and its reasons."""
    row = {"kernel": kernel, "bytes": nbytes}
    with warnings.catch_warnings(record=True) as caught:  # SDPA explains a refusal in warnings
        warnings.simplefilter("always")
        try:
            run, out, graphed = _graphed(fn)
        except (RuntimeError, ValueError, NotImplementedError) as error:
            reasons = [str(w.message).splitlines()[0] for w in caught] + [str(error).splitlines()[0]]
            torch.cuda.synchronize()
            return {**row, "ran": False, "error": "; ".join(reasons)[:500]}
    return {**row, "ran": True, "graphed": graphed, "_run": run, "_out": fn() if out is None else out}


def _measure_all(prepared: list[dict], reference: torch.Tensor | None, rounds: int) -> list[dict]:
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


def _random_inputs(batch, kv_heads, group, head_dim, context, dtype, device):
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
    q, k, v, lengths, nbytes, shape = _random_inputs(batch, kv_heads, group, head_dim, context, dtype, device)

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
    rows = _measure_all([_prepare(name, fn, nbytes) for name, fn in candidates.items()], reference, rounds)
    del candidates, k_long, v_long  # the closures hold the 2L cache: free it before expanding K/V

    # A backend that refuses GQA, re-run on K/V expanded per query head (after the others: G x memory).
    for name, backend in SDPA_BACKENDS.items():
        if group == 1 or next(r for r in rows if r["kernel"] == f"sdpa {name}")["ran"]:
            continue
        k_wide, v_wide = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        expand = triton.testing.do_bench(lambda: (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)),
                                         return_mode="median")
        fn = partial(sdpa, backend, k_wide, v_wide, False)
        row = _measure_all([_prepare(f"sdpa {name}, K/V expanded", fn, nbytes)], reference, 1)[0]
        row.update(expand_ms_median=expand, note="expand excluded from ms; the kernel reads G x the K/V bytes counted")
        rows.append(row)
        del k_wide, v_wide
    torch.cuda.empty_cache()
    return [{**shape, **row} for row in rows]


def tune_dense(batch: int, kv_heads: int, group: int, head_dim: int, context: int,
               dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda") -> list[dict]:
    """dense_decode over a grid of split counts x tile sizes x pipeline depths, and the two fastest
    SDPA backends, at one shape: the evidence for `default_num_splits` and `default_config`."""
    q, k, v, lengths, nbytes, shape = _random_inputs(batch, kv_heads, group, head_dim, context, dtype, device)
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    heads = batch * kv_heads
    # Split counts giving from half a wave to eight waves of one program per SM.
    waves = (0.5, 1, 1.5, 2, 2.5, 3, 4, 6, 8)
    splits = sorted({max(1, min(context // 128, round(w * sm_count / heads))) for w in waves})
    base = default_config(head_dim, dtype)
    default = _prepare("triton split-K (default)", lambda: dense_decode(q, k, v, lengths), nbytes)
    rows = [{**default, "num_splits": default_num_splits(batch, kv_heads, context, sm_count)}]
    for n in splits:
        for block_n in (32, 64):
            for stages in (2, 3, 4):
                config = replace(base, block_n=block_n, num_stages=stages)
                row = _prepare("triton split-K", partial(dense_decode, q, k, v, lengths, n, config=config), nbytes)
                rows.append({**row, "num_splits": n, "block_n": block_n, "num_stages": stages})
        for in_kernel in (True, False):  # where the splits merge, at the default tile
            config = replace(base, merge_in_kernel=in_kernel)
            name = f"triton split-K, merged {'in the kernel' if in_kernel else 'by a second kernel'}"
            row = _prepare(name, partial(dense_decode, q, k, v, lengths, n, config=config), nbytes)
            rows.append({**row, "num_splits": n, "block_n": base.block_n, "num_stages": base.num_stages,
                         "merge_in_kernel": in_kernel})
    q_sdpa = q.unsqueeze(2)
    for name in ("cudnn", "flash"):
        def sdpa(backend=SDPA_BACKENDS[name]):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q_sdpa, k, v, enable_gqa=True)
        rows.append(_prepare(f"sdpa {name}", sdpa, nbytes))
    rows = _measure_all(rows, None, 1)
    torch.cuda.empty_cache()
    return [{**shape, **row} for row in rows]


def benchmark_two_segment(batch: int, kv_heads: int, group: int, head_dim: int, width: int, context: int,
                          tail: int = 256, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda",
                          rounds: int = 3) -> list[dict]:
    """two_segment_decode as a fast step runs it: `width` compact rows per KV head plus the last `tail`
    slots of a cache holding `context` tokens. Bytes: the K/V rows it reads, plus q and the output."""
    q, k, v, lengths, _, shape = _random_inputs(batch, kv_heads, group, head_dim, context, dtype, device)
    compact_k = torch.randn(1, batch, kv_heads, width, head_dim, device=device, dtype=dtype)
    compact_v = torch.randn_like(compact_k)
    counts = torch.full((1, batch, kv_heads), width, device=device, dtype=torch.int32)
    tail_start = torch.full((1, batch), max(context - tail, 0), device=device, dtype=torch.int32)
    row_buffer = torch.zeros(batch, device=device, dtype=torch.int32)
    rows_read = width + min(tail, context)
    nbytes = (2 * batch * kv_heads * rows_read * head_dim + 2 * q.numel()) * k.element_size()
    fn = partial(two_segment_decode, q, compact_k, compact_v, counts, k, v, tail_start, lengths, row_buffer)
    rows = _measure_all([_prepare(f"triton two-segment, {rows_read} rows", fn, nbytes)], None, rounds)
    torch.cuda.empty_cache()
    return [{**shape, "width": width, "tail": tail, **row} for row in rows]


def _print_table(rows: list[dict], copy_gb_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"decode attention, one layer (device copy bandwidth {copy_gb_s:.0f} GB/s)")
    for column in ("B", "context", "kernel", "median ms", "min ms", "max ms", "GB/s", "% of copy", "graph",
                   "note"):
        table.add_column(column, justify="left" if column in ("kernel", "note") else "right")
    for row in rows:
        context = f"{row['context'] // 1024}K" if row["context"] >= 1024 else str(row["context"])
        shape = (str(row["batch"]), context, row["kernel"])
        if not row["ran"]:
            table.add_row(*shape, "-", "-", "-", "-", "-", "-", f"did not run: {row['error'][:60]}")
            continue
        note = f"expand {row['expand_ms_median']:.3f} ms extra" if "expand_ms_median" in row else ""
        table.add_row(*shape, f"{row['ms_median']:.4f}", f"{row['ms_min']:.4f}", f"{row['ms_max']:.4f}",
                      f"{row['gb_s']:.0f}", f"{100 * row['gb_s'] / copy_gb_s:.0f}",
                      "yes" if row["graphed"] else "eager", note)
    Console(width=max(Console().width, 150)).print(table)  # a log file must not wrap the rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sfibench.optimized.bench_attention",
                                     description="Decode attention: split-K Triton kernel vs PyTorch SDPA "
                                                 "backends at the Qwen3-4B shape (H_kv 8, G 4, D 128, bf16).")
    parser.add_argument("--out", type=Path, help="write the rows and provenance here as JSON")
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--contexts", default="8192,32768,131072", help="comma-separated context lengths")
    parser.add_argument("--sweep", action="store_true",
                        help="also time the Triton kernel with its split count, tile and warps varied")
    parser.add_argument("--tune", action="store_true",
                        help="time a grid of split counts x tiles x stages instead (JSON only, no table)")
    parser.add_argument("--two-segment", action="store_true",
                        help="also time the SFI fast-step kernel (4 + 2048 compact rows + a 256-slot tail)")
    parser.add_argument("--groups", default="4", help="comma-separated GQA group sizes (4: Qwen3-4B, 2: 0.6B)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attention times CUDA kernels and no CUDA device is visible here; nothing measured. "
              "Run it on a GPU machine (the kernels' CPU check is tests/test_kernels.py).", file=sys.stderr)
        return 2

    from sfibench.core.provenance import provenance

    copy_gb_s = measure_copy_bandwidth("cuda") / 1e9
    rows = []
    for group in (int(g) for g in args.groups.split(",")):
        shape = {**QWEN3_4B, "group": group}
        for batch in (int(b) for b in args.batch.split(",")):
            for context in (int(c) for c in args.contexts.split(",")):
                if args.tune:
                    rows += tune_dense(batch, context=context, device="cuda", **shape)
                    print(f"tuned G={group} B={batch} L={context}", flush=True)
                else:
                    rows += benchmark_dense(batch, context=context, device="cuda", sweep=args.sweep, **shape)
                    if args.two_segment:
                        rows += benchmark_two_segment(batch, width=4 + 2048, context=context, device="cuda", **shape)
    for row in rows:
        if row["ran"]:
            row["fraction_of_copy_bandwidth"] = row["gb_s"] / copy_gb_s
    if not args.tune:
        _print_table(rows, copy_gb_s)
    if args.out:
        payload = {"provenance": provenance(), "copy_bandwidth_gb_s": copy_gb_s, "rows": rows}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
