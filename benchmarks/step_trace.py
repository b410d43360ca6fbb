"""Where a graphed decode step's time goes, kernel by kernel: torch.profiler (CUPTI) over CUDA-graph replays.

    python benchmarks/step_trace.py MODEL CONTEXT BATCHES METHODS OUT.json
    e.g. python benchmarks/step_trace.py qwen3-0.6b 32768 1,7 full_kv/optimized,streaming_llm/optimized t.json

For each batch and method: a synthetic prefill at CONTEXT, three decode steps (the graph is captured), then
REPLAYS replays under the profiler; then the weights floor's GEMV chain (metrics/floor.py) the same way.
Per replay: each kernel's CUDA time summed by name, grouped into kinds (products, attention, the rest), the
replay's span on the GPU (first kernel start to last kernel end) and the time no kernel ran ("gaps";
negative when PDL overlaps kernels, whose durations then include their wait), and every launch in step
order with its median duration (`sequence`). StreamingLLM's fast step is SFI's fast step's kernel at the
same budget (optimized/sparse_baselines.py), without the refreshes that make SFI's steps differ from one
another. Writes OUT.json and prints a table.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict

import torch

from sfibench.config import MethodSpec
from sfibench.core.provenance import provenance
from sfibench.engine.cache import KVCache
from sfibench.engine.driver import StepDriver
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.methods import create_method
from sfibench.metrics.floor import gemm_chain, graph_replay
from sfibench.optimized.bench_fast_path import cuda_kernels

REPLAYS = 20
KINDS = (("attention", ("split_kernel", "combine_splits")), ("products", ("gemv", "qkv", "gemm", "sm90")))


def kind_of(name: str) -> str:
    return next((kind for kind, keys in KINDS if any(key in name.lower() for key in keys)), "rest")


def trace(replay) -> dict:
    kernels = cuda_kernels(replay, REPLAYS, warmup=5)
    per_replay = len(kernels) // REPLAYS
    by_name, launches, spans, busy = defaultdict(float), Counter(), [], []
    for r in range(REPLAYS):
        chunk = kernels[r * per_replay:(r + 1) * per_replay]
        spans.append(chunk[-1][1] - chunk[0][0])
        busy.append(sum(end - start for start, end, _ in chunk))
        for start, end, name in chunk:
            by_name[name[:90]] += (end - start) / REPLAYS
            launches[name[:90]] += 1
    by_kind = defaultdict(float)
    for name, us in by_name.items():
        by_kind[kind_of(name)] += us
    span, total = sorted(spans)[REPLAYS // 2], sorted(busy)[REPLAYS // 2]
    # Each launch in step order with its median duration over the replays: roles come from the order.
    def median_duration(position):
        durations = sorted(end - start for start, end, _ in kernels[position::per_replay][:REPLAYS])
        return durations[len(durations) // 2]

    sequence = [[kernels[p][2][:40], median_duration(p)] for p in range(per_replay)]
    return {"kernels_per_step": per_replay, "span_us": span, "kernel_us": total, "gaps_us": span - total,
            "by_kind_us": dict(by_kind),
            "by_name_us": dict(sorted(by_name.items(), key=lambda item: -item[1])),
            "count_by_name": {name: count // REPLAYS for name, count in launches.items()}, "sequence": sequence}


def main(model: str, context: int, batches: str, methods: str, out: str) -> None:
    session = Session.open(model, "cuda")
    cfg = session.loaded.config
    rows = []
    for batch in (int(b) for b in batches.split(",")):
        cache = KVCache(cfg, batch, context + 64, "cuda", session.dtype)
        prefilled = synthetic_prefill(cache, context, cfg.vocab_size, cfg.num_heads)
        for item in methods.split(","):
            name, _, path = item.partition("/")
            spec = MethodSpec(name=name, path=path or "optimized")
            method = create_method(spec, cfg, session.loaded.tokenizer)
            driver = StepDriver(session.loaded.model, cache, method, use_graphs=True)
            driver.start(prefilled)
            tokens = torch.zeros(batch, dtype=torch.long, device="cuda")
            for _ in range(3):
                driver.step(tokens)
            row = {"method": item, "batch": batch, "context": context,
                   **trace(next(iter(driver.graphs.values())).graph.replay)}
            rows.append(row)
            kinds = "  ".join(f"{k} {v:.1f}" for k, v in row["by_kind_us"].items())
            print(f"{item} B={batch} ctx={context}: {row['kernels_per_step']} kernels, "
                  f"span {row['span_us']:.1f} us, kernels {row['kernel_us']:.1f}, "
                  f"gaps {row['gaps_us']:.1f}; {kinds}", flush=True)
            for kernel, us in list(row["by_name_us"].items())[:8]:
                print(f"    {us:8.1f} us  x{row['count_by_name'][kernel]:<3} {kernel}", flush=True)
            del driver, method
        # The weights floor's chain (metrics/floor.py) at this batch, traced the same way.
        chain = graph_replay(torch.no_grad()(gemm_chain(session.loaded.model, batch, torch.device("cuda"))))
        row = {"method": "weights floor chain", "batch": batch, "context": 0, **trace(chain)}
        rows.append(row)
        print(f"floor chain B={batch}: {row['kernels_per_step']} kernels, span {row['span_us']:.1f} us, "
              f"kernels {row['kernel_us']:.1f}, gaps {row['gaps_us']:.1f}", flush=True)
        del cache, prefilled
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump({"provenance": provenance(), "model": model, "replays": REPLAYS, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
