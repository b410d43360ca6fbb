"""Decode-attention microbenchmark: the split-K Triton kernel against every PyTorch SDPA backend.

The comparison itself (SPEC section 6: the dense baseline must be as good as the best dense decode
kernel on the machine) is sfibench/metrics/dense_kernels.py, which says how it times and counts bytes;
a throughput run with --dense-kernels records it at the run's shapes. This script runs it at the
Qwen3-4B attention shape, and adds a tuning grid of the kernel's settings (--tune) and SFI's fast-step
two-segment kernel (--two-segment). CUDA only.

    python benchmarks/bench_attention.py --out attention.json
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_common import cuda_visible, write_rows  # benchmarks/ is on sys.path
from torch.nn.attention import sdpa_kernel

from sfibench.metrics.dense_kernels import (
    SDPA_BACKENDS,
    benchmark_dense,
    measure,
    prepare,
    random_decode_inputs,
)
from sfibench.metrics.timing import measure_copy_bandwidth
from sfibench.optimized.decode_attention import default_config, default_num_splits, dense_decode
from sfibench.optimized.two_segment import two_segment_decode

QWEN3_4B = {"kv_heads": 8, "group": 4, "head_dim": 128, "dtype": torch.bfloat16}


def tune_dense(batch: int, kv_heads: int, group: int, head_dim: int, context: int,
               dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda") -> list[dict]:
    """dense_decode over a grid of split counts x tile sizes x pipeline depths, and the two fastest
    SDPA backends, at one shape: the evidence for `default_num_splits` and `default_config`."""
    q, k, v, lengths, nbytes, shape = random_decode_inputs(batch, kv_heads, group, head_dim, context, dtype, device)
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    heads = batch * kv_heads
    # Split counts giving from half a wave to eight waves of one program per SM.
    waves = (0.5, 1, 1.5, 2, 2.5, 3, 4, 6, 8)
    splits = sorted({max(1, min(context // 128, round(w * sm_count / heads))) for w in waves})
    base = default_config(head_dim, dtype)
    default = prepare("triton split-K (default)", lambda: dense_decode(q, k, v, lengths), nbytes)
    rows = [{**default, "num_splits": default_num_splits(batch, kv_heads, context, sm_count)}]
    for n in splits:
        for block_n in (32, 64):
            for stages in (2, 3, 4):
                config = replace(base, block_n=block_n, num_stages=stages)
                row = prepare("triton split-K", partial(dense_decode, q, k, v, lengths, n, config=config), nbytes)
                rows.append({**row, "num_splits": n, "block_n": block_n, "num_stages": stages})
        for in_kernel in (True, False):  # where the splits merge, at the default tile
            config = replace(base, merge_in_kernel=in_kernel)
            name = f"triton split-K, merged {'in the kernel' if in_kernel else 'by a second kernel'}"
            row = prepare(name, partial(dense_decode, q, k, v, lengths, n, config=config), nbytes)
            rows.append({**row, "num_splits": n, "block_n": base.block_n, "num_stages": base.num_stages,
                         "merge_in_kernel": in_kernel})
    q_sdpa = q.unsqueeze(2)
    for name in ("cudnn", "flash"):
        def sdpa(backend=SDPA_BACKENDS[name]):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q_sdpa, k, v, enable_gqa=True)
        rows.append(prepare(f"sdpa {name}", sdpa, nbytes))
    rows = measure(rows, None, 1)
    torch.cuda.empty_cache()
    return [{**shape, **row} for row in rows]


def benchmark_two_segment(batch: int, kv_heads: int, group: int, head_dim: int, width: int, context: int,
                          tail: int = 256, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda",
                          rounds: int = 3) -> list[dict]:
    """two_segment_decode as a fast step runs it: `width` compact rows per KV head plus the last `tail`
    slots of a cache holding `context` tokens. Bytes: the K/V rows it reads, plus q and the output."""
    q, k, v, lengths, _, shape = random_decode_inputs(batch, kv_heads, group, head_dim, context, dtype, device)
    compact_k = torch.randn(1, batch, kv_heads, width, head_dim, device=device, dtype=dtype)
    compact_v = torch.randn_like(compact_k)
    counts = torch.full((1, batch, kv_heads), width, device=device, dtype=torch.int32)
    tail_start = torch.full((1, batch), max(context - tail, 0), device=device, dtype=torch.int32)
    row_buffer = torch.zeros(batch, device=device, dtype=torch.int32)
    rows_read = width + min(tail, context)
    nbytes = (2 * batch * kv_heads * rows_read * head_dim + 2 * q.numel()) * k.element_size()
    fn = partial(two_segment_decode, q, compact_k, compact_v, counts, k, v, tail_start, lengths, row_buffer)
    rows = measure([prepare(f"triton two-segment, {rows_read} rows", fn, nbytes)], None, rounds)
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
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_attention.py",
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
    if not cuda_visible("bench_attention", " Run it on a GPU machine (the kernels' CPU check is "
                        "tests/kernels/test_kernels.py)."):
        return 2
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
    write_rows(args.out, {"copy_bandwidth_gb_s": copy_gb_s, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
