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
4. The retrieval methods' ranking (`--ranking CONTEXTS`, at `--ranking-batch`): what the optimized Quest
   and TidalDecode spend choosing what to read, at the qwen3-4b shape (36 layers, 8 KV heads of 4 query
   heads, D = 128, bf16) and the default budget. Quest: page_scores then top_k over the pages in each of
   its 34 sparse layers (K = 143 pages); TidalDecode: token_scores then top_k over the slots in its 2
   selection layers (K = 2,307). Each layer has its own bounds or keys, all captured in one CUDA graph and
   replayed (a step's launches as a step makes them); then top_k alone the same way. To compare two
   versions of the kernels, run the same script against the other checkout's package:
   `PYTHONPATH=OTHER_CHECKOUT python benchmarks/bench_fast_path.py ...` (the rows record which one ran).
5. Quest's page scoring alone (`--page-tiles CONTEXTS`, at `--ranking-batch`): retrieval_kernels.page_scores
   over its 34 selecting layers in one graph under other pages per program and warp counts, with the bounds'
   read bandwidth (two bf16 bounds per page and channel, 1/16 of the K+V bytes), against the copy bandwidth
   that bounds it.

    python benchmarks/bench_fast_path.py --out fast_path.json
    python benchmarks/bench_fast_path.py --batch "" --contexts "" --selector-tiles 130944
    python benchmarks/bench_fast_path.py --batch "" --contexts "" --ranking 8192,32768,131072 --out r.json
    python benchmarks/bench_fast_path.py --batch "" --contexts "" --page-tiles 32768,131072 --out p.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

import sfibench
from sfibench.metrics.floor import graph_replay
from sfibench.optimized import compact_kernels, top_k_kernels
from sfibench.optimized.decode_attention import KernelConfig, default_num_splits, sm_count
from sfibench.optimized.retrieval_kernels import page_scores, token_scores
from sfibench.optimized.selector_kernels import SelectorTiles, fused_scores
from sfibench.optimized.sfi import fused_select, score_params
from sfibench.optimized.top_k_kernels import radix_top_k
from sfibench.optimized.two_segment import two_segment_decode
from sfibench.sfi import state
from sfibench.sfi.selector import select, top_k_positions
from sfibench.sfi.selector_config import SelectorConfig


def _time_ms(fn, repeats: int = 5, calls: int = 20) -> list[float]:
    """Per-call milliseconds of `fn`, median of `calls` calls per repeat, for each repeat."""
    fn()
    torch.cuda.synchronize()
    medians = []
    for _ in range(repeats):
        times = []
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        medians.append(statistics.median(times))
    return medians


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
        medians = _time_ms(graph.replay)
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
    torch_ms = _time_ms(lambda: select(logits, norms, 4, k_head, cfg), repeats=3, calls=5)
    triton_ms = _time_ms(lambda: fused_select(logits, norms, 4, k_head, cfg), repeats=3, calls=5)
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
        rounds = _time_ms(lambda top_k=top_k: top_k(scores, k_head, 4), repeats=3, calls=10)
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
    torch_ms = _time_ms(lambda: state.gather_compact(*args), repeats=3, calls=10)
    triton_ms = _time_ms(lambda: compact_kernels.gather_compact(*args), repeats=3, calls=10)
    # K and V, each row read once and written once
    bytes_moved = 2 * 2 * layers * kv_heads * (sinks + k_head) * 128 * 2
    result = {"context": context, "batch": batch, "layers": layers, "kv_heads": kv_heads, "k_head": k_head,
              "torch_ms": statistics.median(torch_ms), "triton_ms": statistics.median(triton_ms),
              "torch_ms_rounds": torch_ms, "triton_ms_rounds": triton_ms, "bytes": bytes_moved}
    print(f"compact gather {context} B={batch}: torch {result['torch_ms']:.3f} ms, triton "
          f"{result['triton_ms']:.3f} ms ({bytes_moved / 1e6:.0f} MB moved)", flush=True)
    del k_cache, v_cache, compact
    return result


def _graphed_ms(step) -> list[float]:
    """Per-replay ms of `step` captured in one CUDA graph (metrics/floor.graph_replay warms it up first)."""
    return _time_ms(graph_replay(step), repeats=3, calls=20)


def retrieval_ranking(context: int, batch: int, layers: int = 36, kv_heads: int = 8, group: int = 4,
                      head_dim: int = 128, budget: int = 2308, page: int = 16) -> list[dict]:
    """ms per step of Quest's and TidalDecode's choice of what to read (scoring + top_k over all their
    selecting layers, one graph), and of top_k alone, at one context and batch; every row at full length."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    lengths = torch.full((batch,), context, device=device)
    q = torch.randn(batch, kv_heads * group, head_dim, device=device, dtype=dtype)
    rows = []
    for method, selecting, n, k in (("quest", layers - 2, -(-context // page), budget // page - 1),
                                    ("tidaldecode", 2, context, budget - 1)):
        if method == "quest":
            keys = torch.randn(batch, kv_heads, context, head_dim, device=device, dtype=dtype)  # one layer's is enough
            bounds = [(torch.randn(batch, kv_heads, n, head_dim, device=device, dtype=dtype).abs(),
                       -torch.randn(batch, kv_heads, n, head_dim, device=device, dtype=dtype).abs())
                      for _ in range(selecting)]

            def score(layer, out, keys=keys, bounds=bounds):
                page_scores(q, *bounds[layer], keys, lengths, page, out=out)
        else:
            keys = [torch.randn(batch, kv_heads, context, head_dim, device=device, dtype=dtype)
                    for _ in range(selecting)]

            def score(layer, out, keys=keys):
                token_scores(q, keys[layer], lengths, out=out)

        def score_and_rank(layer, out, k, score=score):  # both methods score, then rank
            score(layer, out)
            return top_k_kernels.top_k(out, k, 0)

        scores = [torch.empty(batch, kv_heads, n, device=device) for _ in range(selecting)]
        for layer in range(selecting):
            score(layer, scores[layer])
        expected = scores[0].clone()  # each way of choosing gives the scores and the oracle's choice of them
        assert torch.equal(top_k_kernels.top_k(scores[0], k, 0), top_k_positions(expected, k, 0))
        assert torch.equal(score_and_rank(0, scores[0], k), top_k_positions(expected, k, 0))
        assert torch.equal(scores[0], expected)

        def choose(score_and_rank=score_and_rank, scores=scores, k=k):
            for layer, out in enumerate(scores):
                score_and_rank(layer, out, k)

        def rank(scores=scores, k=k):
            for out in scores:
                top_k_kernels.top_k(out, k, 0)

        chosen, ranked = _graphed_ms(choose), _graphed_ms(rank)
        row = {"method": method, "context": context, "batch": batch, "selecting_layers": selecting,
               "candidates": n, "k": k, "score_and_rank_ms": statistics.median(chosen),
               "rank_ms": statistics.median(ranked), "score_and_rank_ms_rounds": chosen, "rank_ms_rounds": ranked,
               "sfibench": str(Path(sfibench.__file__).parent)}
        print(f"ranking {method} {context} B={batch} ({selecting} layers, K={k} of {n}): scoring + top_k "
              f"{row['score_and_rank_ms']:.3f} ms, top_k {row['rank_ms']:.3f} ms", flush=True)
        rows.append(row)
        del keys, scores
        if method == "quest":
            del bounds
        torch.cuda.empty_cache()
    return rows


def page_tiles(context: int, batch: int, layers: int = 34, kv_heads: int = 8, group: int = 4,
               head_dim: int = 128, page: int = 16) -> list[dict]:
    """ms per step of Quest's page scoring alone (its 34 selecting layers, one graph) under other pages per
    program and warp counts, with the bounds' read bandwidth and each shape's largest score difference from
    the default's (float32 sums in another order)."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    lengths = torch.full((batch,), context, device=device)
    q = torch.randn(batch, kv_heads * group, head_dim, device=device, dtype=dtype)
    keys = torch.randn(batch, kv_heads, context, head_dim, device=device, dtype=dtype)
    pages = -(-context // page)
    bounds = [(torch.randn(batch, kv_heads, pages, head_dim, device=device, dtype=dtype).abs(),
               -torch.randn(batch, kv_heads, pages, head_dim, device=device, dtype=dtype).abs())
              for _ in range(layers)]
    scores = [torch.empty(batch, kv_heads, pages, device=device) for _ in range(layers)]
    bound_bytes = 2 * layers * batch * kv_heads * pages * head_dim * bounds[0][0].element_size()
    expected = page_scores(q, *bounds[0], keys, lengths, page).clone()
    rows = []
    for block_pages, warps in itertools.product((32, 64, 128, 256), (2, 4, 8)):
        diff = (page_scores(q, *bounds[0], keys, lengths, page, block_pages=block_pages, num_warps=warps)
                - expected).abs().nan_to_num(0.0).max().item()

        def step(block_pages=block_pages, warps=warps, bounds=bounds, keys=keys, scores=scores):
            for layer in range(layers):
                page_scores(q, *bounds[layer], keys, lengths, page, out=scores[layer],
                            block_pages=block_pages, num_warps=warps)

        ms = _graphed_ms(step)
        median = statistics.median(ms)
        row = {"context": context, "batch": batch, "layers": layers, "block_pages": block_pages,
               "num_warps": warps, "ms": median, "ms_rounds": ms,
               "bounds_gb_per_s": bound_bytes / median / 1e6, "max_abs_diff_vs_default": diff}
        print(f"page tiles {context} B={batch} block_pages={block_pages} warps={warps}: {row['ms']:.3f} ms, "
              f"bounds at {row['bounds_gb_per_s']:.0f} GB/s", flush=True)
        rows.append(row)
    del bounds, keys, scores
    torch.cuda.empty_cache()
    return rows


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
    parser.add_argument("--ranking", default="", help="contexts at which to time Quest's and TidalDecode's "
                        "scoring and top_k, e.g. 8192,32768,131072")
    parser.add_argument("--ranking-batch", default="1,6",
                        help="batch sizes of the --ranking and --page-tiles timings")
    parser.add_argument("--page-tiles", default="", help="contexts at which to time Quest's page scoring "
                        "alone under other pages per program and warp counts, e.g. 131072")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fast_path times CUDA kernels and no CUDA device is visible here; nothing measured.",
              file=sys.stderr)
        return 2
    from sfibench.core.provenance import provenance

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
    ranking = [row for c in args.ranking.split(",") if c for b in args.ranking_batch.split(",") if b
               for row in retrieval_ranking(int(c), int(b))]
    scoring = [row for c in args.page_tiles.split(",") if c for b in args.ranking_batch.split(",") if b
               for row in page_tiles(int(c), int(b))]
    payload = {"provenance": provenance(), "sm_count": sms,
               "rule": {"dense read (B=1, 128K)": default_num_splits(1, 8, 130944, sms),
                        **{f"fast step (B={b}, 2,308 rows)": default_num_splits(int(b), 8, 2308, sms)
                           for b in args.batch.split(",") if b}},
               "fast_step_attention": attention, "selector": selector, "compact_rebuild": rebuild,
               "selector_tiles": tiles, "retrieval_ranking": ranking, "page_tiles": scoring}
    if args.out:
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
