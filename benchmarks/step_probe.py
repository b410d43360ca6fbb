"""Diagnose where a decode step's time goes on the GPU: graph replay alone vs the harness loop.

python benchmarks/step_probe.py MODEL CONTEXT  (writes nothing; prints ms per step)
"""

import sys

import torch

from sfibench.config import MethodSpec
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.engine.cache import KVCache
from sfibench.methods import create_method
from sfibench.engine.driver import StepDriver

model, context = sys.argv[1], int(sys.argv[2])
session = Session.open(model, "cuda")
cfg = session.loaded.config
cache = KVCache(cfg, 1, context + 300, "cuda", session.dtype)
pre = synthetic_prefill(cache, context, cfg.vocab_size, cfg.num_heads)
for name, path in [("full_kv", "optimized"), ("streaming_llm", "reference")]:
    method = create_method(MethodSpec(name=name, path=path), cfg, session.loaded.tokenizer)
    runner = StepDriver(session.loaded.model, cache, method, use_graphs=True)
    runner.start(pre)
    tokens = torch.zeros(1, dtype=torch.long, device="cuda")
    for i in range(1, 4):
        runner.step(tokens)
    graph = next(iter(runner.graphs.values())).graph
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(100):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_ms = start.elapsed_time(end) / 100
    start.record()
    for i in range(4, 104):
        runner.step(tokens)
    end.record()
    torch.cuda.synchronize()
    step_ms = start.elapsed_time(end) / 100
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    print(f"{name}/{path} ctx {context}: graph replay {replay_ms:.3f} ms/step, runner.step loop {step_ms:.3f} ms/step")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
