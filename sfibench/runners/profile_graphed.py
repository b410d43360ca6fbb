"""`sfibench profile` on the optimized path: where a graphed decode step's time goes, against its floor.

Eager profiling (profile.py) shows launch gaps, not what a CUDA-graph replay pays, so here every
part is timed as it runs in a throughput run, from CUDA graphs on the device:

- the fast step: a replay of the step the throughput run replays (median over the timed steps);
- weights GEMMs: the model's own weight matrices chained in one graph (the weights floor, metrics/floor.py);
- attention: the step's attention launches alone (begin_step + one kernel per layer), graphed;
- the rest: step - GEMMs - attention, i.e. norms, RoPE, cache append, SwiGLU, residuals and the gaps
  between the ~6 kernels per layer: engine overhead every method pays;
- per refresh (SFI): the Selector over all layers, and the selection publish + compact rebuild, each
  timed on its own (they run on the side stream in the asynchronous mode, the main one in the synchronous).
"""

from __future__ import annotations

import statistics

import torch

from sfibench.engine.method import MethodSpec
from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.decode import batch_step_kind
from sfibench.engine.driver import StepDriver
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.registry import create_method
from sfibench.metrics.floor import graph_replay, weights_floor_seconds
from sfibench.metrics.timing import StepTimer, time_region
from sfibench.optimized import pdl
from sfibench.sfi.geometry import candidate_range
from sfibench.workloads.replay import load_replay, step_inputs, take_rows

REST = "the rest (norms, RoPE, append, SwiGLU, gaps)"


@torch.no_grad()
def profile_graphed(session: Session, spec: MethodSpec, context: int, steps: int, margin: int,
                    batch: int = 1) -> dict:
    cfg, device, model = session.loaded.config, session.device, session.loaded.model
    stream, tokenizer = load_replay(cfg.vocab_size, session.loaded.tokenizer)
    cache = KVCache(cfg, batch, context + steps + margin, device, session.dtype)
    prefilled = synthetic_prefill(cache, context, cfg.vocab_size, cfg.num_heads)
    method = create_method(spec, cfg, tokenizer)
    driver = StepDriver(model, cache, method, use_graphs=True)
    inputs = step_inputs(take_rows(stream, context, batch, steps + 1), device)  # step i's tokens: row i
    kinds, timer = [], StepTimer(device)
    for timed in (False, True):  # the first pass captures the graphs
        driver.start(prefilled)
        method.observe(inputs[0])
        for index in range(steps):
            with timer.step():
                result = driver.step(inputs[index].to(device, non_blocking=True))
            kind = batch_step_kind(method, result.ctx)
            method.observe(inputs[index + 1])
            if timed:
                kinds.append(kind)
        if not timed:
            timer = StepTimer(device)
    by_kind: dict[str, list[float]] = {}
    for kind, (_, seconds) in zip(kinds, timer.durations()):
        by_kind.setdefault(kind, []).append(seconds * 1e3)
    main_kind = next(k for k in ("fast", "dense", "sparse") if k in by_kind)
    folded = getattr(model, "folded_input_norms", False)
    norms = "input norms folded into the qkv products" if folded else "input norms unfolded"
    if getattr(model, "folded_post_attention_norms", False):
        norms += ", post-attention norms into gate_up"
    step_ms = statistics.median(by_kind[main_kind])
    floor = weights_floor_seconds(model, batch, device)
    weights_ms = floor["seconds"] * 1e3
    attention = [seconds * 1e3 for seconds in _attention_alone(driver, method, cache, cfg)]
    attention_ms = statistics.median(attention)
    rest = [max(ms - weights_ms - attention_ms, 0.0) for ms in (step_ms, min(by_kind[main_kind]), max(by_kind[main_kind]))]
    result = {"method": spec.name, "path": spec.path, "context": context, "batch": batch, "steps": steps,
              "step_kinds": kinds,
              "ms_per_step": {"weights GEMMs (floor chain)": weights_ms, "attention kernels": attention_ms,
                              REST: rest[0]},
              # range over the repeats of each timing; the rest takes the spread of the replayed steps
              "ms_per_step_range": {"weights GEMMs (floor chain)": [floor["min_seconds"] * 1e3, floor["max_seconds"] * 1e3],
                                    "attention kernels": [min(attention), max(attention)], REST: rest[1:]},
              "step_ms_by_kind": {k: statistics.median(v) for k, v in by_kind.items()},
              "wall_ms_per_step": step_ms, "wall_ms_range": [min(by_kind[main_kind]), max(by_kind[main_kind])],
              "clock": f"CUDA-graph replays, {main_kind} step, PDL {pdl.describe()}, {norms}", "graphs": True}
    if method.has_slow_steps:  # a refresh: the Selector and the rebuild, timed apart
        result["per_refresh_ms"] = _refresh_parts(method, cache, int(cache.lengths_host[0]))
    return result


def _attention_alone(driver: StepDriver, method, cache: KVCache, cfg) -> list[float]:
    """Seconds of one step's attention launches per timed replay of a graph of them alone (a fast step's plan)."""
    ctx = StepContext(step=0, positions=cache.lengths, kv_lengths=driver.kv_lengths,
                      kv_lengths_host=cache.lengths_host + 1, slow=torch.zeros(cache.batch, dtype=torch.bool),
                      tokens_read=driver.tokens_read, length_bucket=driver.length_bucket)
    plan = next((p for p in driver.graphs if not getattr(p, "evidence", False)), None)
    q = torch.randn(cache.batch, cfg.num_heads, 1, cfg.head_dim, device=cache.k.device, dtype=cache.k.dtype)

    def attention():
        method.begin_step(ctx, plan)
        for layer in range(cfg.num_layers):
            ctx.layer = layer
            method.attend(q, cache, ctx, plan)

    return time_region(graph_replay(attention), cache.k.device, warmup=2, repeats=20)


def _refresh_parts(method, cache: KVCache, length: int) -> dict:
    """One refresh of row 0 over all layers at `length`, in two timed parts (eager, device-timed)."""
    layers = list(range(method.model_config.num_layers))
    lo, hi = candidate_range(length, method.cfg)
    norms = cache.key_norms[:, 0, :, lo:hi]
    picks = []

    def selector():
        # the method's own Selector: the Triton one on the optimized path, the PyTorch one on the reference
        picks[:] = [method.select(method.decode_evidence(0, layers, lo, hi), norms, lo, method.cfg.k_head,
                                  method.cfg.selector)]

    def rebuild():
        method.sel.publish(layers, 0, method.sel.write(layers, 0, picks[0], length, cache))

    device = cache.k.device
    return {"selector": statistics.median(time_region(selector, device, warmup=1, repeats=5)) * 1e3,
            "publish + compact rebuild": statistics.median(time_region(rebuild, device, warmup=1, repeats=5)) * 1e3,
            "candidates": hi - lo}
