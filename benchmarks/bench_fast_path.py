"""What the optimized SFI pays outside dense attention: fast-step attention over all layers, and a refresh.

1. Fast-step attention (`--splits`): two_segment_decode as a fast step runs it, one launch per layer
   over `layers` layers (each its own compact buffer and cache, so nothing is served from L2 that a
   real step would read from HBM), captured in one CUDA graph and replayed, for each split count.
   A fast step reads ~2.3K rows per (sequence, KV head): the fixed costs of a launch (reading the
   row's counts, the queries, merging the splits) weigh as much as the loads, so the split count that
   fills the GPU for a dense read may not be the best one here; this measures it (default_num_splits).
2. The Selector (`--contexts`): one refresh of all layers at one context, the PyTorch Selector
   (sfi/selector.select) against the Triton one (optimized/sfi.fused_select: optimized/selector_kernels.py
   and the radix top-K), both on the same evidence, with the share of positions they agree on; then where the Triton Selector's time
   goes, kernel by kernel (torch.profiler's CUDA times), and the compact rebuild's gather, the torch
   reference (sfi/state.gather_compact) against the Triton kernel (optimized/compact_kernels).
3. The Selector's launch shapes (`--selector-tiles CONTEXTS`): each Triton Selector kernel's time under
   other tiles, chunks and warp counts (selector_kernels.SelectorTiles), one group varied at a time.

Quest's and TidalDecode's choice of what to read is timed by benchmarks/bench_retrieval.py.

    python benchmarks/bench_fast_path.py --out fast_path.json
    python benchmarks/bench_fast_path.py --batch "" --contexts "" --selector-tiles 130944
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
from pathlib import Path

import torch
from bench_common import cuda_visible, time_ms, write_rows  # benchmarks/ is on sys.path

from sfibench.optimized import compact_kernels
from sfibench.optimized.decode_attention import KernelConfig, default_num_splits, sm_count
from sfibench.optimized.selector_kernels import SelectorTiles, fused_scores
from sfibench.optimized.sfi import fused_select, score_params
from sfibench.optimized.top_k_kernels import radix_top_k
from sfibench.optimized.two_segment import two_segment_decode
from sfibench.sfi import state
from sfibench.sfi.selector import select, top_k_positions
from sfibench.sfi.selector_config import SelectorConfig


def fast_step_attention(batch: int, kv_heads: int, group: int, head_dim: int, layers: int, compact_rows: int,
                        tail: int, splits: list[int], variants: list[tuple[KernelConfig, str]],
                        context: int = 0) -> list[dict]:
    """ms per fast step's attention (all layers, one graph) for each split count and kernel variant
    (tile config incl. where the splits merge, and the loop form: "1" one loop over both segments, "0" a
    loop per segment). The tail is the
    last `tail` slots of a cache of `context` slots (default 4 x tail; a long one is left uninitialised:
    what it holds does not change the speed, and filling ~100 GB would take longer than the timing)."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    context = context or 4 * tail
    compact_k = torch.randn(layers, 1, batch, kv_heads, compact_rows, head_dim, device=device, dtype=dtype)
    compact_v = torch.randn_like(compact_k)
    fill = torch.randn if context <= 4 * tail else torch.empty
    k = fill(layers, batch, kv_heads, context, head_dim, device=device, dtype=dtype)
    v = fill(layers, batch, kv_heads, context, head_dim, device=device, dtype=dtype)
    if fill is torch.empty:  # the slots read get finite values: NaN or inf could take other paths in the MMA
        k[..., context - tail:, :].normal_()
        v[..., context - tail:, :].normal_()
    q = torch.randn(batch, kv_heads * group, head_dim, device=device, dtype=dtype)
    counts = torch.full((1, batch, kv_heads), compact_rows, device=device, dtype=torch.int32)
    tail_start = torch.full((1, batch), context - tail, device=device, dtype=torch.int32)
    lengths = torch.full((batch,), context, device=device, dtype=torch.int32)
    row_buffer = torch.zeros(batch, device=device, dtype=torch.int32)
    rows = []
    for num_splits, (config, loops) in itertools.product(splits, variants):
        def step(num_splits=num_splits, config=config, loops=loops):
            for layer in range(layers):
                two_segment_decode(q, compact_k[layer], compact_v[layer], counts, k[layer], v[layer], tail_start,
                                   lengths, row_buffer, num_splits=num_splits, config=config, one_loop=loops == "1")
        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        medians = time_ms(graph.replay)
        rows.append({"batch": batch, "group": group, "layers": layers, "rows_read": compact_rows + tail,
                     "compact_rows": compact_rows, "tail_rows": tail, "cache_slots": context,
                     "num_splits": num_splits, "block_n": config.block_n, "num_stages": config.num_stages,
                     "merge_in_kernel": config.merge_in_kernel, "one_loop": loops == "1",
                     "ms_per_step": statistics.median(medians), "ms_spread": (max(medians) - min(medians)) / 2})
        print(f"fast-step attention B={batch} G={group} rows={compact_rows}+{tail}/{context} splits={num_splits} "
              f"{config} loops={loops}: "
              f"{rows[-1]['ms_per_step']:.4f} ms", flush=True)
        del graph
    return rows


def random_evidence(context: int, layers: int, kv_heads: int, group: int,
                    device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """A refresh's inputs at `context` (candidates: all but 4 sinks and a 256-token window), seeded: evidence
    logits `[layers, kv_heads, group, n]` and key norms `[layers, kv_heads, n]`."""
    n = context - 4 - 256
    generator = torch.Generator(device).manual_seed(0)
    logits = torch.randn(layers, kv_heads, group, n, device=device, generator=generator) * 2
    norms = torch.rand(layers, kv_heads, n, device=device, generator=generator) * 10 + 1
    return logits, norms


def selector_refresh(context: int, layers: int, kv_heads: int, group: int, k_head: int) -> dict:
    """ms of one refresh's Selector over all layers, PyTorch against Triton, on the same random evidence."""
    logits, norms = random_evidence(context, layers, kv_heads, group)
    n = logits.shape[-1]
    cfg = SelectorConfig()
    torch_ms = time_ms(lambda: select(logits, norms, 4, k_head, cfg), repeats=3, calls=5)
    triton_ms = time_ms(lambda: fused_select(logits, norms, 4, k_head, cfg), repeats=3, calls=5)
    a, b = select(logits, norms, 4, k_head, cfg), fused_select(logits, norms, 4, k_head, cfg)
    same = (a[..., :, None] == b[..., None, :]).any(-1).float().mean().item() if a.numel() < 2e8 else None
    row = {"context": context, "candidates": n, "layers": layers, "kv_heads": kv_heads, "group": group,
           "k_head": k_head, "torch_ms": statistics.median(torch_ms), "triton_ms": statistics.median(triton_ms),
           "torch_ms_rounds": torch_ms, "triton_ms_rounds": triton_ms, "position_overlap": same}
    print(f"selector {context}: torch {row['torch_ms']:.2f} ms, triton {row['triton_ms']:.2f} ms, "
          f"overlap {same}", flush=True)
    row["triton_kernels_ms"] = kernel_times(lambda: fused_select(logits, norms, 4, k_head, cfg))
    # The top-K alone on these final scores: the radix select against the PyTorch one (torch.topk for the
    # K-th best, cumulative sums for the ranks). torch.topk plus one compaction program per head measured
    # 0.999 ms at 128K on an H200 against the radix select's 0.899.
    scores = fused_scores(logits, norms, score_params(cfg))
    assert torch.equal(radix_top_k(scores, k_head, 4), top_k_positions(scores, k_head, 4))
    for name, top_k in (("radix", radix_top_k), ("torch", top_k_positions)):
        rounds = time_ms(lambda top_k=top_k: top_k(scores, k_head, 4), repeats=3, calls=10)
        row[f"top_k_{name}_ms"], row[f"top_k_{name}_ms_rounds"] = statistics.median(rounds), rounds
        print(f"  top-K {name}: {row[f'top_k_{name}_ms']:.3f} ms", flush=True)
    return row


def selector_tiles(context: int, layers: int, kv_heads: int, group: int) -> list[dict]:
    """CUDA ms per refresh of each Selector kernel under other launch shapes (SelectorTiles), one group of
    settings varied at a time from the defaults, on the same random evidence; with each shape's largest
    score difference from the default's (float32 sums in another order)."""
    logits, norms = random_evidence(context, layers, kv_heads, group)
    cfg, default = SelectorConfig(), SelectorTiles()
    shapes = [default]
    shapes += [SelectorTiles(block=b, chunk_blocks=c, pool_warps=w) for b, c, w in
               itertools.product((512, 1024, 2048), (1, 2, 8), (4, 8))]
    shapes += [SelectorTiles(stream_block=b) for b in (1024, 4096)]
    shapes += [SelectorTiles(nms_tile=t, nms_warps=w)
               for t, w in itertools.product((128, 256, 512, 1024), (4, 8))]
    expected = fused_scores(logits, norms, score_params(cfg), default)
    rows = []
    for tiles in dict.fromkeys(shapes):  # the default appears in both sweeps: once is enough
        diff = (fused_scores(logits, norms, score_params(cfg), tiles) - expected).abs().nan_to_num(0.0).max().item()
        kernels = kernel_times(lambda tiles=tiles: fused_scores(logits, norms, score_params(cfg), tiles), quiet=True)
        kernels = {name: ms for name, ms in kernels.items() if name.startswith("_")}  # the Triton kernels
        rows.append({"context": context, **dataclasses.asdict(tiles), "kernels_ms": kernels,
                     "triton_ms": sum(kernels.values()), "max_abs_diff_vs_default": diff})
        print(f"selector tiles {tiles}: {sum(kernels.values()):.3f} ms "
              + " ".join(f"{name} {ms:.3f}" for name, ms in kernels.items()), flush=True)
    return rows


def cuda_kernels(fn, calls: int, warmup: int = 1) -> list[tuple[float, float, str]]:
    """(start, end, name), microseconds, of every CUDA kernel that `calls` calls of `fn` launch under
    torch.profiler (CUPTI: kernels inside a CUDA-graph replay too), in start order, after `warmup` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type == cuda and e.time_range.end > e.time_range.start)


def kernel_times(fn, calls: int = 10, quiet: bool = False) -> dict[str, float]:
    """CUDA time per call of each kernel `fn` launches (torch.profiler), largest first."""
    totals: dict[str, float] = {}
    for start, end, name in cuda_kernels(fn, calls):
        totals[name[:80]] = totals.get(name[:80], 0.0) + (end - start) / 1000 / calls
    for name, ms in sorted(totals.items(), key=lambda item: -item[1])[:0 if quiet else 12]:
        print(f"    {ms:8.4f} ms  {name}", flush=True)
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def compact_rebuild(context: int, batch: int, layers: int, kv_heads: int, k_head: int,
                    sinks: int = 4) -> dict:
    """ms of one refresh's compact gather (all layers of one row), torch reference against Triton."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    k_cache = torch.randn(layers, batch, kv_heads, context, 128, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    compact = [torch.zeros(2, layers, batch, kv_heads, sinks + k_head, 128, device=device, dtype=dtype)
               for _ in range(2)]
    picks = torch.rand(layers, kv_heads, context - sinks, device=device).topk(k_head, dim=-1).indices
    picks = picks.sort(dim=-1).values + sinks
    target = torch.arange(layers, device=device)
    row = batch - 1
    args = (k_cache, v_cache, *compact, 1, target, row, sinks, picks)
    torch_ms = time_ms(lambda: state.gather_compact(*args), repeats=3, calls=10)
    triton_ms = time_ms(lambda: compact_kernels.gather_compact(*args), repeats=3, calls=10)
    # K and V, each row read once and written once
    bytes_moved = 2 * 2 * layers * kv_heads * (sinks + k_head) * 128 * 2
    result = {"context": context, "batch": batch, "layers": layers, "kv_heads": kv_heads, "k_head": k_head,
              "torch_ms": statistics.median(torch_ms), "triton_ms": statistics.median(triton_ms),
              "torch_ms_rounds": torch_ms, "triton_ms_rounds": triton_ms, "bytes": bytes_moved}
    print(f"compact gather {context} B={batch}: torch {result['torch_ms']:.3f} ms, triton "
          f"{result['triton_ms']:.3f} ms ({bytes_moved / 1e6:.0f} MB moved)", flush=True)
    del k_cache, v_cache, compact
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_fast_path.py",
                                     description="Optimized SFI: fast-step attention by split count, and the "
                                                 "Selector PyTorch vs Triton (Qwen3-4B shape: 36 layers, H_kv 8).")
    parser.add_argument("--out", type=Path, help="write the rows and provenance here as JSON")
    parser.add_argument("--batch", default="1,5")
    parser.add_argument("--groups", default="4,2", help="GQA group sizes (4: Qwen3-4B, 2: Qwen3-0.6B)")
    parser.add_argument("--splits", default="4,8,16,24,32,48,64")
    parser.add_argument("--block-n", default="32,64", help="keys per tile")
    parser.add_argument("--stages", default="2,4", help="software-pipelining stages")
    parser.add_argument("--merge", default="kernel,separate", help="where splits merge: kernel (the last split "
                        "to finish) and/or separate (a second kernel)")
    parser.add_argument("--one-loop", default="0,1", help="0: a loop per segment, 1: one loop over both")
    parser.add_argument("--rows", default="2052+256", help="fast-step reads as COMPACT+TAIL[/CACHE_SLOTS], "
                        "comma-separated: rows from the compact buffer, from the cache's tail, and the cache's size "
                        "(default 4 x TAIL), e.g. 2052+256/130944,2276+80,4+2304")
    parser.add_argument("--contexts", default="32768,130944", help="contexts of the Selector timing")
    parser.add_argument("--selector-tiles", default="", help="contexts at which to time the Selector kernels "
                        "under other launch shapes (optimized/selector_kernels.SelectorTiles), e.g. 130944")
    args = parser.parse_args(argv)
    if not cuda_visible("bench_fast_path"):
        return 2
    sms = sm_count(torch.device("cuda"))
    merges = {"kernel": True, "separate": False}
    variants = [(KernelConfig(block_n=int(n), num_warps=4, num_stages=int(st), merge_in_kernel=merges[m]), o)
                for n, st, m, o in itertools.product(args.block_n.split(","), args.stages.split(","),
                                                     args.merge.split(","), args.one_loop.split(","))]
    attention = []
    for group in (int(g) for g in args.groups.split(",") if g):
        layers = 36 if group == 4 else 28
        for batch in (int(b) for b in args.batch.split(",") if b):
            splits = sorted({int(s) for s in args.splits.split(",")} | {default_num_splits(batch, 8, 2308, sms)})
            for shape in args.rows.split(","):
                read, _, slots = shape.partition("/")
                compact_rows, tail = (int(n) for n in read.split("+"))
                attention += fast_step_attention(batch, 8, group, 128, layers, compact_rows, tail, splits, variants,
                                                 int(slots or 0))
                torch.cuda.empty_cache()
    selector = [selector_refresh(int(c), 36, 8, 4, 2048) for c in args.contexts.split(",") if c]
    rebuild = [compact_rebuild(int(c), 5, 36, 8, 2048) for c in args.contexts.split(",") if c]
    tiles = [row for c in args.selector_tiles.split(",") if c for row in selector_tiles(int(c), 36, 8, 4)]
    payload = {"sm_count": sms,
               "rule": {"dense read (B=1, 128K)": default_num_splits(1, 8, 130944, sms),
                        **{f"fast step (B={b}, 2,308 rows)": default_num_splits(int(b), 8, 2308, sms)
                           for b in args.batch.split(",") if b}},
               "fast_step_attention": attention, "selector": selector, "compact_rebuild": rebuild,
               "selector_tiles": tiles}
    write_rows(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
