"""`sfibench profile` run: where one decode step's time goes, per component, from torch.profiler.

Steps run eagerly so every kernel is visible (CUDA graphs would hide the launch gaps this command
exists to show). torch.profiler labels (record_function) mark attention, the sparse methods' index
build, each Selector stage, the q/k/v/o projections and the MLP; everything else in a step (norms,
embedding, LM head) is "other model ops". At decode the projections' label also covers the q/k norm,
RoPE and KV-cache append after the qkv product (one op, which the fused path may run as one kernel). On
a GPU, "launch gaps" is the step's wall time minus the time kernels were running.

The reference SFI keeps no compact copy of the selected K/V: a fast step gathers through an index
list rebuilt every step ("sparse index build"), which is where an optimized path's compact rebuild
after each refresh would show.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from sfibench import registry
from sfibench.engine.method import MethodSpec
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import batch_step_kind
from sfibench.engine.driver import StepDriver
from sfibench.engine.prefill import prefill
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.metrics.memory import check_fits, estimate_memory
from sfibench.options import check_context_limit
from sfibench.reporting.report_run import render
from sfibench.reporting.results import write_results
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.workloads.replay import load_replay, take_rows

PROFILE_MARGIN = 8  # cache positions beyond the profiled steps: two warm-up steps and slack

# label -> (component name, the component it runs inside). A component's row is its own time: the
# time of the components nested in it is subtracted, so the rows add up to the step.
LABELS = {
    "sfibench.attend": ("attention", None),
    "sfibench.sparse_index": ("sparse index build", "attention"),
    "sfibench.selector": ("selector: glue", None),
    "sfibench.rebuild": ("selection publish + compact rebuild", None),
    "sfibench.selector.logits": ("selector: evidence logits", "selector: glue"),
    "sfibench.selector.pool": ("selector: power-mean pooling", "selector: glue"),
    "sfibench.selector.prior_fusion": ("selector: prior + fusion", "selector: glue"),
    "sfibench.selector.nms": ("selector: soft-NMS", "selector: glue"),
    "sfibench.selector.cross_head": ("selector: cross-head", "selector: glue"),
    "sfibench.selector.top_k": ("selector: top-K", "selector: glue"),
    "sfibench.projections": ("q/k/v/o projections", None),
    "sfibench.mlp": ("MLP", None),
}


def exclusive_times(inclusive: dict[str, float]) -> dict[str, float]:
    """Each component's time without the components nested inside it (all labelled names present)."""
    own = dict(inclusive)
    for name, parent in LABELS.values():
        if parent is not None:
            own[parent] -= inclusive[name]
    return {name: max(value, 0.0) for name, value in own.items()}


def _times(event, cuda: bool) -> float:
    """Microseconds an event kept the device (CUDA) or the host (CPU) busy, children included."""
    return getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0)) if cuda else event.cpu_time_total


def profile_steps(session: Session, spec: MethodSpec, context: int, steps: int, batch: int = 1) -> dict:
    cfg, device = session.loaded.config, session.device
    if device.type == "cuda" and spec.path == "optimized":  # what a graphed step pays, part by part
        from sfibench.runners.profile_graphed import profile_graphed

        return profile_graphed(session, spec, context, steps, PROFILE_MARGIN, batch)
    stream, tokenizer = load_replay(cfg.vocab_size, session.loaded.tokenizer)
    cache = KVCache(cfg, batch, context + steps + PROFILE_MARGIN, device, session.dtype)
    if device.type == "cuda":
        prefilled = synthetic_prefill(cache, context, cfg.vocab_size, cfg.num_heads)
    else:
        prefilled = prefill(session.loaded.model, cache, take_rows(stream, 0, batch, context).tolist())
    method = registry.create_method(spec, cfg, tokenizer)
    inputs = take_rows(stream, context, batch, steps + 4)  # as a throughput run's rows
    driver = StepDriver(session.loaded.model, cache, method)
    driver.start(prefilled)
    method.observe(inputs[:, 0])
    for step in range(1, 3):  # warm-up: lazy initialisation stays out of the profile
        driver.step(inputs[:, step - 1].to(device))
        method.observe(inputs[:, step])
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    kinds, walls_us, per_step = [], [], []
    # One profiler window per step (`schedule`), so each component gets a time per step and a spread; the
    # untimed steps above warmed up, so the profiler's warnings about warm-up and per-cycle events do not apply.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(warmup|clears events).*", category=UserWarning)
        with profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=1, repeat=steps),
                     on_trace_ready=lambda prof: per_step.append(_components(prof, cuda, walls_us[-1]))) as prof:
            for step in range(3, 3 + steps):
                started = time.perf_counter()
                ctx = driver.step(inputs[:, step - 1].to(device)).ctx
                if cuda:
                    torch.cuda.synchronize()
                walls_us.append((time.perf_counter() - started) * 1e6)
                kinds.append(batch_step_kind(method, ctx))
                method.observe(inputs[:, step])
                prof.step()
    per_step_ms = {name: [step[name] / 1e3 for step in per_step] for name in per_step[0]}
    return {"method": spec.name, "path": spec.path, "context": context, "batch": batch, "steps": steps,
            "step_kinds": kinds,
            "ms_per_step": {name: sum(values) / len(values) for name, values in per_step_ms.items()},
            "ms_per_step_range": {name: [min(values), max(values)] for name, values in per_step_ms.items()},
            "wall_ms_per_step": sum(walls_us) / steps / 1e3,
            "wall_ms_range": [min(walls_us) / 1e3, max(walls_us) / 1e3],
            "clock": "device kernel time" if cuda else "host time", "graphs": False}


def _components(prof, cuda: bool, wall_us: float) -> dict[str, float]:
    """Microseconds of each component in one profiled step; the rows add up to the step."""
    totals = {name: 0.0 for name, _ in LABELS.values()}
    events = prof.key_averages()
    for event in events:
        # On CUDA a label also appears as a GPU-side range of the same name, whose length (kernels and
        # the gaps between them) would be counted on top of its CPU event's kernel time: skip it.
        if event.key in LABELS and event.device_type.name == "CPU":
            totals[LABELS[event.key][0]] += _times(event, cuda)
    totals = exclusive_times(totals)
    busy = sum(_times(e, True) for e in events  # kernels only, not the labels' GPU ranges
               if e.device_type.name == "CUDA" and e.key not in LABELS) if cuda else wall_us
    totals["other model ops"] = max(busy - sum(totals.values()), 0.0)
    if cuda:
        totals["launch gaps (idle device)"] = max(wall_us - busy, 0.0)
    return totals


@dataclass(frozen=True)
class ProfileRun:
    """Everything `sfibench profile` runs with, checked by the command (commands/profile.py)."""

    model: str
    device: str
    dtype: str
    method: str
    path: str
    context: int
    steps: int
    batch: int = 1
    out: Path | None = None
    overwrite: bool = False


def run_profile(run: ProfileRun) -> Path:
    """Profile `run.steps` decode steps of `run.batch` sequences into a claimed run directory and return it
    (results.json, plot, report.md)."""
    with claimed_run_dir(run.out, "profile", overwrite=run.overwrite) as run_dir:
        session = Session.open(run.model, run.device, run.dtype)
        check_context_limit(session.loaded.config, [run.context], run.steps + PROFILE_MARGIN)
        _check_batch_fits(session, run.batch, run.context + run.steps + PROFILE_MARGIN)
        result = profile_steps(session, registry.spec(run.method, run.path), run.context, run.steps, run.batch)
        write_results(run_dir, "profile", {"model": session.loaded.config.name, "context": run.context,
                                           "method": run.method, "path": run.path, "steps": run.steps,
                                           "batch": run.batch}, result)
        render(run_dir)
    return run_dir


def _check_batch_fits(session: Session, batch: int, max_seq: int) -> None:
    """Refuse, before allocating, a batch x context whose weights, KV cache and workspace cannot fit (the
    weights are already resident on a GPU); methods' own buffers are not counted, so this is a lower bound."""
    estimate = estimate_memory(session.loaded.config, batch, max_seq, session.cache_dtype_bytes)
    check_fits(estimate, session.memory_for_estimate())
