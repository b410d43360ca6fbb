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

import contextlib
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from sfibench import registry
from sfibench.core.device import idle_cores_only, resolve_device
from sfibench.core.progress import starting
from sfibench.core.provenance import provenance
from sfibench.core.parallel import rank_device, ranks
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import batch_step_kind
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import MethodConfig, MethodSpec
from sfibench.engine.prefill import prefill
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.metrics.memory import check_fits, estimate_memory
from sfibench.models.shape import PROFILE_MARGIN, check_context_limit
from sfibench.reporting.report_run import render
from sfibench.reporting.results import write_results
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.workloads.replay import load_replay, take_rows

WARMUP = 2  # first decode steps left out: lazy initialisation
SEARCH_STEPS = 128  # steps decoded, at most, to meet every step kind (SFI's t_max of 96 forces a slow step)

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


def expected_kinds(method) -> list[str]:
    """The step kinds a method has: a refreshing method's fast and slow steps, else its one kind."""
    return ["fast", "slow"] if method.has_slow_steps else [method.step_kind]


@contextmanager
def profiler_chatter_dropped():
    """torch's profiler library prints a `USDT: ... profiler_start` / `profiler_stop` line to the process's
    stderr (file descriptor 2, below Python) every time a profiler starts or stops. Those lines are held
    back while profiling; anything else written there is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith("USDT:")]
            if kept:
                sys.stderr.write("".join(kept))


def _decode(driver, method, prefilled, inputs, device, profiled=frozenset(), stop=None):
    """Decode from the prefill, teacher-forced on `inputs`: each step's kind, wall time (µs) and, for the
    step numbers in `profiled`, its components. Stops after the last input row or when `stop(kinds)`."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    kinds, walls_us, components = [], [], {}
    driver.start(prefilled)
    method.observe(inputs[:, 0])
    for step in range(1, inputs.shape[1]):
        tokens = inputs[:, step - 1].to(device)
        recorder = profile(activities=activities) if step in profiled else contextlib.nullcontext()
        with recorder as prof:
            started = time.perf_counter()
            ctx = driver.step(tokens).ctx
            if cuda:
                torch.cuda.synchronize()
            walls_us.append((time.perf_counter() - started) * 1e6)
        if step in profiled:
            components[step] = _components(prof, cuda, walls_us[-1])
        kinds.append(batch_step_kind(method, ctx))
        method.observe(inputs[:, step])
        if stop is not None and stop(kinds):
            break
    return kinds, walls_us, components


def profile_steps(session: Session, spec: MethodSpec, context: int, steps: int, batch: int = 1,
                  search: int = SEARCH_STEPS) -> dict:
    """Profile `steps` eager decode steps and, where they hold none, the first step of each other kind the
    method has (SFI: a slow step with its Selector) within `search` steps.

    A first pass decodes without the profiler, recording each step's kind and wall time; a second replays
    the same teacher-forced tokens from the same prefill (so the same steps come out slow) and profiles
    the chosen steps one by one. The first pass's times are what the profiler's own cost is judged by."""
    cfg, device = session.loaded.config, session.device
    if device.type == "cuda" and spec.path == "optimized":  # what a graphed step pays, part by part
        from sfibench.runners.profile_graphed import profile_graphed

        return profile_graphed(session, spec, context, steps, PROFILE_MARGIN, batch)
    search = max(search, steps + WARMUP)
    stream, tokenizer = load_replay(cfg.vocab_size, session.loaded.tokenizer)
    cache = KVCache(cfg, batch, context + search + PROFILE_MARGIN, device, session.dtype)
    starting(f"prefill of {context:,} tokens x {batch} ({'synthetic' if device.type == 'cuda' else 'real'})")
    if device.type == "cuda":
        prefilled = synthetic_prefill(cache, context, cfg.vocab_size, cfg.num_heads)
    else:
        prefilled = prefill(session.loaded.model, cache, take_rows(stream, 0, batch, context).tolist())
    method = registry.create_method(spec, cfg, tokenizer)
    inputs = take_rows(stream, context, batch, search + 1)  # as a throughput run's rows
    driver = StepDriver(session.loaded.model, cache, method)
    wanted = expected_kinds(method)

    def met(kinds: list[str]) -> bool:  # the warm-up steps (lazy initialisation) count for nothing
        return len(kinds) >= WARMUP + steps and set(wanted) <= set(kinds[WARMUP:])

    starting(f"{spec.name}/{spec.path}: decoding until {steps} steps and one of each step kind are met "
             f"(at most {search})")
    kinds, walls_us, _ = _decode(driver, method, prefilled, inputs, device, stop=met)
    chosen = set(range(WARMUP + 1, WARMUP + steps + 1))  # step numbers count from 1
    for kind in wanted:
        if kind not in {kinds[s - 1] for s in chosen}:
            chosen |= {s for s in range(WARMUP + 1, len(kinds) + 1) if kinds[s - 1] == kind}
    starting(f"{spec.name}/{spec.path}: profiling {len(chosen)} of those steps one by one")
    with profiler_chatter_dropped():
        replayed, replay_walls_us, components = _decode(driver, method, prefilled, inputs[:, : max(chosen) + 1], device, chosen)
    profiled = sorted(chosen)
    by_kind: dict[str, list[int]] = {}
    for step in profiled:
        by_kind.setdefault(replayed[step - 1], []).append(step)
    unprofiled: dict[str, list[float]] = {}
    for kind, wall in list(zip(kinds, walls_us))[WARMUP:]:
        unprofiled.setdefault(kind, []).append(wall / 1e3)
    per_kind = {kind: _summary([components[s] for s in numbers], [replay_walls_us[s - 1] for s in numbers])
                for kind, numbers in by_kind.items()}
    main = next((k for k in ("fast", "dense", "sparse") if k in per_kind), next(iter(per_kind)))
    return {"method": spec.name, "path": spec.path, "context": context, "batch": batch, "steps": len(profiled),
            "step_kinds": [replayed[s - 1] for s in profiled], "main_kind": main, **per_kind[main],
            "by_kind": per_kind, "kinds_missing": [k for k in wanted if k not in per_kind],
            "searched_steps": len(kinds) - WARMUP,
            "step_ms_by_kind": {k: statistics.median(v) for k, v in unprofiled.items()},
            "unprofiled_steps_by_kind": {k: len(v) for k, v in unprofiled.items()},
            "clock": "device kernel time" if device.type == "cuda" else "host time", "graphs": False}


def _summary(steps: list[dict], walls_us: list[float]) -> dict:
    """Mean and range of each component over some profiled steps of one kind, leaving out the components
    that never ran in them (a fast step runs no Selector), and the steps' wall time."""
    names = [n for n in steps[0] if any(step[n] > 0 for step in steps)]
    per_step = {name: [step[name] / 1e3 for step in steps] for name in names}
    return {"ms_per_step": {name: statistics.fmean(values) for name, values in per_step.items()},
            "ms_per_step_range": {name: [min(values), max(values)] for name, values in per_step.items()},
            "wall_ms_per_step": statistics.fmean(walls_us) / 1e3,
            "wall_ms_range": [min(walls_us) / 1e3, max(walls_us) / 1e3], "profiled_steps": len(steps)}


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
    threads: int | None = None  # torch's CPU threads; None: idle_cores_only's choice
    config: MethodConfig | None = None  # the method's settings at `context`; None: its defaults
    given: dict = field(default_factory=dict)  # --budget and SFI's settings as given, recorded in results.json


def run_profile(run: ProfileRun) -> Path | None:
    """Profile `run.steps` decode steps of `run.batch` sequences into a claimed run directory and return it
    (results.json, plot, report.md). Under tensor parallelism every rank profiles its own share of the step
    (their collectives keep them in step) and rank 0 alone claims, writes and returns the directory with its
    own components; the other ranks return None."""
    with ranks(rank_device(resolve_device(run.device))) as parallel:
        if not parallel.is_main:
            _profile(run, Session.open(run.model, run.device, run.dtype, parallel=parallel))
            return None
        with claimed_run_dir(run.out, "profile", overwrite=run.overwrite) as run_dir:
            session = Session.open(run.model, run.device, run.dtype, parallel=parallel)
            result, ran_with = _profile(run, session)
            write_results(run_dir, "profile", {"model": session.loaded.config.name, "context": run.context,
                                               "method": run.method, "path": run.path, "steps": run.steps,
                                               "batch": run.batch, **run.given}, result, provenance_info=ran_with)
        render(run_dir)
    return run_dir


def _profile(run: ProfileRun, session: Session) -> tuple[dict, dict]:
    """The run's profiled steps on this process's session, with the ranks it ran over, and the provenance
    (taken while the steps' thread count holds)."""
    check_context_limit(session.loaded.config, [run.context], run.steps + PROFILE_MARGIN)
    # steps decoded while looking for every step kind, as many as the model's limit leaves room for
    search = max(min(SEARCH_STEPS, session.max_tokens - run.context - PROFILE_MARGIN), run.steps + WARMUP)
    _check_batch_fits(session, run.batch, run.context + search + PROFILE_MARGIN)
    with idle_cores_only(session.device, run.threads):  # a busy core would stall every step's threads
        result = profile_steps(session, registry.spec(run.method, run.path, run.config), run.context, run.steps,
                               run.batch, search)
        ran_with, threads = provenance(), torch.get_num_threads()
    # the ranks (processes) the model was split over; the components are rank 0's share of each step
    return {**result, "tp": session.parallel.world_size, "threads": threads}, ran_with


def _check_batch_fits(session: Session, batch: int, max_seq: int) -> None:
    """Refuse, before allocating, a batch x context whose weights, KV cache and workspace cannot fit (the
    weights are already resident on a GPU); methods' own buffers are not counted, so this is a lower bound."""
    estimate = estimate_memory(session.loaded.config, batch, max_seq, session.cache_dtype_bytes)
    check_fits(estimate, session.memory_for_estimate())
