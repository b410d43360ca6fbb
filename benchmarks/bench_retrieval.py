"""What the optimized Quest and TidalDecode spend choosing what to read, at the qwen3-4b shape (36 layers,
8 KV heads of 4 query heads, D = 128, bf16) and the default budget.

1. Their ranking (`--ranking CONTEXTS`, at `--batch`): Quest's page_scores then top_k over the pages in each
   of its 34 sparse layers (K = 143 pages); TidalDecode's token_scores then top_k over the slots in its 2
   selection layers (K = 2,307). Each layer has its own bounds or keys, all captured in one CUDA graph and
   replayed (a step's launches as a step makes them); then top_k alone the same way. To compare two
   versions of the kernels, run the same script against the other checkout's package:
   `PYTHONPATH=OTHER_CHECKOUT python benchmarks/bench_retrieval.py ...` (the rows record which one ran).
2. Quest's page scoring alone (`--page-tiles CONTEXTS`, at `--batch`): retrieval_kernels.page_scores over its
   34 selecting layers in one graph under other pages per program and warp counts, with the bounds' read
   bandwidth (two bf16 bounds per page and channel, 1/16 of the K+V bytes), against the copy bandwidth that
   bounds it.

    python benchmarks/bench_retrieval.py --ranking 8192,32768,131072 --out r.json
    python benchmarks/bench_retrieval.py --page-tiles 32768,131072 --out p.json
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

import torch
from bench_common import cuda_visible, time_ms, write_rows  # benchmarks/ is on sys.path

import sfibench
from sfibench.metrics.floor import graph_replay
from sfibench.optimized import top_k_kernels
from sfibench.optimized.retrieval_kernels import page_scores, token_scores
from sfibench.sfi.selector import top_k_positions

LAYERS, KV_HEADS, GROUP, HEAD_DIM, PAGE = 36, 8, 4, 128, 16  # the qwen3-4b shape, Quest's pages
QUEST_LAYERS = LAYERS - 2  # Quest reads its first two layers densely


def _graphed_ms(step) -> list[float]:
    """Per-replay ms of `step` captured in one CUDA graph (metrics/floor.graph_replay warms it up first)."""
    return time_ms(graph_replay(step), repeats=3, calls=20)


def quest_inputs(context: int, batch: int) -> tuple:
    """Random inputs of one Quest step at full length: lengths, the query, one layer's keys (the new key is
    folded in from there; one layer's is enough) and each selecting layer's page bounds (max, min)."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    lengths = torch.full((batch,), context, device=device)
    q = torch.randn(batch, KV_HEADS * GROUP, HEAD_DIM, device=device, dtype=dtype)
    keys = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=device, dtype=dtype)
    pages = -(-context // PAGE)
    bounds = [(torch.randn(batch, KV_HEADS, pages, HEAD_DIM, device=device, dtype=dtype).abs(),
               -torch.randn(batch, KV_HEADS, pages, HEAD_DIM, device=device, dtype=dtype).abs())
              for _ in range(QUEST_LAYERS)]
    return lengths, q, keys, bounds


def retrieval_ranking(context: int, batch: int, budget: int = 2308) -> list[dict]:
    """ms per step of Quest's and TidalDecode's choice of what to read (scoring + top_k over all their
    selecting layers, one graph), and of top_k alone, at one context and batch; every row at full length."""
    lengths, q, quest_keys, bounds = quest_inputs(context, batch)
    rows = []
    for method, selecting, n, k in (("quest", QUEST_LAYERS, -(-context // PAGE), budget // PAGE - 1),
                                    ("tidaldecode", 2, context, budget - 1)):
        if method == "quest":
            def score(layer, out):
                page_scores(q, *bounds[layer], quest_keys, lengths, PAGE, out=out)
        else:
            keys = [torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=q.device, dtype=q.dtype)
                    for _ in range(selecting)]

            def score(layer, out, keys=keys):
                token_scores(q, keys[layer], lengths, out=out)

        def score_and_rank(layer, out, k, score=score):  # both methods score, then rank
            score(layer, out)
            return top_k_kernels.top_k(out, k, 0)

        scores = [torch.empty(batch, KV_HEADS, n, device=q.device) for _ in range(selecting)]
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
               "rank_ms": statistics.median(ranked), "score_and_rank_ms_rounds": chosen,
               "rank_ms_rounds": ranked, "sfibench": str(Path(sfibench.__file__).parent)}
        print(f"ranking {method} {context} B={batch} ({selecting} layers, K={k} of {n}): scoring + top_k "
              f"{row['score_and_rank_ms']:.3f} ms, top_k {row['rank_ms']:.3f} ms", flush=True)
        rows.append(row)
        del scores
        torch.cuda.empty_cache()
    return rows


def page_tiles(context: int, batch: int) -> list[dict]:
    """ms per step of Quest's page scoring alone (its 34 selecting layers, one graph) under other pages per
    program and warp counts, with the bounds' read bandwidth and each shape's largest score difference from
    the default's (float32 sums in another order)."""
    lengths, q, keys, bounds = quest_inputs(context, batch)
    scores = [torch.empty(high.shape[:3], device=q.device) for high, _ in bounds]
    bound_bytes = sum(high.numel() * high.element_size() * 2 for high, _ in bounds)
    expected = page_scores(q, *bounds[0], keys, lengths, PAGE).clone()
    rows = []
    for block_pages, warps in itertools.product((32, 64, 128, 256), (2, 4, 8)):
        diff = (page_scores(q, *bounds[0], keys, lengths, PAGE, block_pages=block_pages, num_warps=warps)
                - expected).abs().nan_to_num(0.0).max().item()

        def step(block_pages=block_pages, warps=warps):
            for layer, out in enumerate(scores):
                page_scores(q, *bounds[layer], keys, lengths, PAGE, out=out, block_pages=block_pages,
                            num_warps=warps)

        ms = _graphed_ms(step)
        median = statistics.median(ms)
        row = {"context": context, "batch": batch, "layers": len(bounds), "block_pages": block_pages,
               "num_warps": warps, "ms": median, "ms_rounds": ms,
               "bounds_gb_per_s": bound_bytes / median / 1e6, "max_abs_diff_vs_default": diff}
        print(f"page tiles {context} B={batch} block_pages={block_pages} warps={warps}: {median:.3f} ms, "
              f"bounds at {row['bounds_gb_per_s']:.0f} GB/s", flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_retrieval.py",
                                     description="Quest's and TidalDecode's choice of what to read on the "
                                                 "optimized path (Qwen3-4B shape: 36 layers, H_kv 8).")
    parser.add_argument("--out", type=Path, help="write the rows and provenance here as JSON")
    parser.add_argument("--ranking", default="", help="contexts at which to time Quest's and TidalDecode's "
                        "scoring and top_k, e.g. 8192,32768,131072")
    parser.add_argument("--page-tiles", default="", help="contexts at which to time Quest's page scoring "
                        "alone under other pages per program and warp counts, e.g. 131072")
    parser.add_argument("--batch", default="1,6", help="batch sizes of both timings")
    args = parser.parse_args(argv)
    if not cuda_visible("bench_retrieval"):
        return 2
    shapes = [(int(c), int(b)) for c in args.ranking.split(",") if c for b in args.batch.split(",") if b]
    tiles = [(int(c), int(b)) for c in args.page_tiles.split(",") if c for b in args.batch.split(",") if b]
    payload = {"retrieval_ranking": [row for c, b in shapes for row in retrieval_ranking(c, b)],
               "page_tiles": [row for c, b in tiles for row in page_tiles(c, b)]}
    write_rows(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
