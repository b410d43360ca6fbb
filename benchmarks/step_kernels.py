"""Which GPU kernels one decode step runs, and how long each takes on the device.

    python benchmarks/step_kernels.py MODEL CONTEXT METHOD/PATH [METHOD/PATH ...]

Runs a few eager steps after a synthetic prefill (random K/V), then profiles five more with CUPTI and
prints, per kernel name, its launches per step and GPU microseconds per step, plus the step's wall
time replayed from a CUDA graph. Kernel durations are device time, so their sum against the graphed
step time shows what the gaps between kernels cost. Prints only; a diagnostic, not a report.
"""

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from sfibench.config import MethodSpec
from sfibench.engine.cache import KVCache
from sfibench.engine.driver import StepDriver
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.methods import create_method

PROFILED_STEPS = 5

model, context, methods = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
session = Session.open(model, "cuda")
cfg = session.loaded.config
cache = KVCache(cfg, 1, context + 400, "cuda", session.dtype)
prefilled = synthetic_prefill(cache, context, cfg.vocab_size, cfg.num_heads)
tokens = torch.zeros(1, dtype=torch.long, device="cuda")
for spec in methods:
    name, path = spec.split("/")
    method = create_method(MethodSpec(name=name, path=path), cfg, session.loaded.tokenizer)
    for graphs in (False, True):
        driver = StepDriver(session.loaded.model, cache, method, use_graphs=graphs)
        driver.start(prefilled)
        for _ in range(8):  # past the bootstrap and compilation; SFI steps here are fast steps
            driver.step(tokens)
            method.observe(tokens)
        torch.cuda.synchronize()
        if graphs:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                driver.step(tokens)
                method.observe(tokens)
            end.record()
            end.synchronize()
            print(f"{spec}: graphed step {start.elapsed_time(end) / 20:.3f} ms (incl. host planning)")
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILED_STEPS):
                driver.step(tokens)
                method.observe(tokens)
            torch.cuda.synchronize()
        per_kernel = defaultdict(lambda: [0, 0.0])
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[event.name][0] += 1
                per_kernel[event.name][1] += event.device_time
        total = sum(us for _, us in per_kernel.values()) / PROFILED_STEPS
        print(f"\n{model} ctx {context} {spec}: kernels per step, GPU time {total / 1000:.3f} ms")
        for kernel, (count, us) in sorted(per_kernel.items(), key=lambda item: -item[1][1])[:25]:
            print(f"  {us / PROFILED_STEPS:9.1f} us  x{count / PROFILED_STEPS:5.1f}  {kernel[:110]}")
