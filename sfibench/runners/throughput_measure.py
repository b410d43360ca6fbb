"""`sfibench throughput`'s measurement: decode speed of every method on one engine, with the byte roofline.

For each (context, batch) the cache is prefilled once (really, or synthetically at long contexts),
then every (method, path) decodes the same replayed real-text token stream, teacher-forced, so SFI's
sentence triggers fire at natural rates. One untimed pass captures the CUDA graphs, then `repeats`
timed passes give the median and spread; per-step CUDA events give the latency by step kind.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from sfibench import registry
from sfibench.core.progress import starting
from sfibench.engine.cache import KVCache
from sfibench.engine.compact import compact_prefill, compact_slots, uses_compact_cache
from sfibench.engine.decode import batch_step_kind
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import MethodSpec
from sfibench.engine.prefill import Prefilled, prefill
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.metrics.bytes_model import kv_read_bytes, roofline_ratio, step_bytes
from sfibench.metrics.floor import all_reduce_seconds, weights_floor_seconds
from sfibench.metrics.memory import EVIDENCE_ROWS, MemoryEstimateError, memory_record
from sfibench.metrics.nvml import NvmlSampler, energy_per_token
from sfibench.metrics.stats import percentiles, spread
from sfibench.metrics.timing import StepTimer
from sfibench.reporting.speedup_claims import full_kv_reference, speedup_claim
from sfibench.runners.throughput_batches import batch_plan, marked, spec_key
from sfibench.runners.throughput_memory import (
    check_shape_fits,
    largest_fitting_batch,
    planned_bytes,
    run_estimate,
)
from sfibench.runners.throughput_run import ThroughputRun
from sfibench.workloads.replay import load_replay, step_inputs, take_rows

MAX_REDONE = 3  # timed passes run again because they had to capture a graph (measure)


def method_specs(cfg: ThroughputRun, context: int) -> list[MethodSpec]:
    """Every method at the budget reference's tokens read (SFI's right after a refresh): equal budgets, not
    nominal ratios. `cfg.sfi` holds the budget reference's settings; every other method takes its own
    settings at that budget. A method may time several variants on a path (the optimized SFI: its Selector
    inside the slow step, and on a second stream)."""
    budget = cfg.sfi.tokens_read(context)
    specs = []
    for name, path in cfg.methods:
        own = cfg.sfi if name == registry.BUDGET_REFERENCE else registry.at_budget(name, path, budget).config
        specs += [MethodSpec(name, path, variant) for variant in own.variants(path)]
    return specs


def largest_batch(session: Session, cfg: ThroughputRun, context: int) -> int:
    """The largest batch whose memory estimate fits at `context` (runners/throughput_memory.py); refused
    with the one-line error before anything is allocated where not even one sequence fits."""
    max_seq = context + cfg.steps + 1
    synthetic = _synthetic(cfg, context)
    specs = method_specs(cfg, context)
    batch = largest_fitting_batch(session, specs, max_seq, synthetic, cfg.steps, compact=compacts(cfg))
    if batch < 1:
        _check_session_fits(session, specs, 1, max_seq, synthetic, cfg.steps, compacts(cfg))
    return batch


def own_largest_batches(session: Session, cfg: ThroughputRun, context: int) -> dict[tuple, int]:
    """`--batch max`: each method spec's own largest batch at `context` (spec_key -> batch) by its estimate alone
    (keeping part of each prompt fits more sequences); the one-line error where not one sequence fits."""
    return {spec_key(spec): largest_batch(session, replace(cfg, methods=((spec.name, spec.path),)), context)
            for spec in method_specs(cfg, context)}


def check_before_loading(cfg: ThroughputRun, context: int, dims, dtype_bytes: int, gpu: bool,
                         planned: int) -> None:
    """Refuse, from the model's shape `dims` alone (no weight allocated), each batch of `cfg` at `context` whose
    estimate exceeds `planned` bytes (one line naming what fits); a "max" batch at one sequence, its least."""
    specs, max_seq, synthetic = method_specs(cfg, context), context + cfg.steps + 1, _synthetic(cfg, context)
    for batch in sorted({1 if b == "max" else int(b) for b in cfg.batches}):
        check_shape_fits(dims, specs, batch, max_seq, dtype_bytes, synthetic, gpu, planned, cfg.steps,
                         compact=compacts(cfg))


def compacts(cfg: ThroughputRun) -> bool:
    """Whether a method keeping part of each prompt decodes from a compact cache: fixed-context runs, not requests."""
    return not cfg.requests


def _check_session_fits(session: Session, specs: list[MethodSpec], batch: int, max_seq: int,
                        synthetic: bool, steps: int, compact: bool = True) -> None:
    check_shape_fits(session.loaded.config, specs, batch, max_seq, session.cache_dtype_bytes, synthetic,
                     session.device.type == "cuda", planned_bytes(session), steps, compact=compact)


def _synthetic(cfg: ThroughputRun, context: int) -> bool:
    """`auto`: synthetic from 16K tokens, except in request mode: its time to first token is a real
    prefill's."""
    return cfg.prefill == "synthetic" or (cfg.prefill == "auto" and not cfg.requests and context >= 16384)


def prepare_cache(session: Session, cfg: ThroughputRun, context: int, batch: int, stream: torch.Tensor,
                  seed: int) -> tuple[Prefilled, bool, float]:
    """Allocate (after checking it fits) and prefill.

    Returns the snapshot, whether it was synthetic, and the fill's wall time in seconds (the device
    synchronised at both ends; allocation excluded). Decode throughput never includes it (SPEC 7).
    """
    steps = cfg.steps
    max_seq = context + steps + 1
    session.cache = None
    if session.device.type == "cuda":
        torch.cuda.empty_cache()
        # the prefill's peak counts from here, the previous shape's cache freed: the weights, then this shape
        torch.cuda.reset_peak_memory_stats(session.device)
    _check_session_fits(session, method_specs(cfg, context), batch, max_seq, _synthetic(cfg, context), steps,
                        compacts(cfg))
    _check_limit(session, context, steps)
    session.cache = KVCache(session.loaded.config, batch, max_seq, session.device, session.dtype)
    synthetic = _synthetic(cfg, context)
    cfg = session.loaded.config
    prompts = None if synthetic else take_rows(stream, 0, batch, context).tolist()
    _synchronize(session.device)
    began = time.perf_counter()
    if synthetic:
        prefilled = synthetic_prefill(session.cache, context, cfg.vocab_size, cfg.num_heads, EVIDENCE_ROWS, seed)
    else:
        prefilled = prefill(session.loaded.model, session.cache, prompts, evidence_rows=EVIDENCE_ROWS)
    _synchronize(session.device)
    return prefilled, synthetic, time.perf_counter() - began


def _check_limit(session: Session, context: int, steps: int) -> None:
    if context + steps > session.max_tokens:
        raise MemoryEstimateError(f"context {context} + {steps} steps exceeds the model's limit of "
                                  f"{session.max_tokens} tokens; use a shorter --ctx")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(session: Session, prefilled: Prefilled, spec: MethodSpec, cfg: ThroughputRun,
            inputs: torch.Tensor, tokenizer, context: int, method=None) -> dict:
    """Decode `cfg.steps` teacher-forced steps per pass; one warm pass, then `cfg.repeats` timed ones.
    `inputs [cfg.steps + 1, B]`: step i's tokens are row i (replay.step_inputs). `method`: the one that chose
    what a compact cache keeps (None: made here)."""
    model, cache, device = session.loaded.model, session.cache, session.device
    method = method or registry.create_method(spec, session.loaded.config, tokenizer)
    runner = StepDriver(model, cache, method, cfg.graphs, cfg.length_bucket)
    passes, kinds, read_sums, replays, refreshes = [], [], {}, 0, 0
    sampler = NvmlSampler(device.index or 0) if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # Pass 0 is the warm-up that captures the graphs. A timed pass that still had to capture one (a plan
    # first met there: the asynchronous SFI's plans depend on when its side stream publishes) measured a
    # capture, not decoding: it is run again, at most MAX_REDONE times in all.
    repeat, redone, sampling = 0, 0, False
    while len(passes) < cfg.repeats:
        timed = repeat > 0
        repeat += 1
        if timed and sampler and not sampling:
            sampler.start()
            sampling = True
        runner.start(prefilled)
        method.observe(inputs[0])
        timer = StepTimer(device)
        captured_before = runner.capture_seconds
        pass_kinds, pass_reads, pass_replays, pass_refreshes = [], {}, 0, 0
        for index in range(1, cfg.steps + 1):
            tokens = inputs[index - 1].to(device, non_blocking=True)
            with timer.step():
                result = runner.step(tokens)
            ctx, replayed = result.ctx, result.replayed
            kind = batch_step_kind(method, ctx)
            method.observe(inputs[index])
            pass_kinds.append(kind)
            pass_replays += replayed
            pass_refreshes += int(ctx.slow.sum())
            pass_reads[kind] = pass_reads.get(kind, 0) + ctx.tokens_read.sum()
        if not timed:
            continue
        if runner.capture_seconds > captured_before and redone < MAX_REDONE:
            redone += 1
            continue
        passes.append([seconds for _, seconds in timer.durations()])
        kinds += pass_kinds
        replays += pass_replays
        refreshes += pass_refreshes
        for kind, total in pass_reads.items():
            read_sums[kind] = read_sums.get(kind, 0) + total
    energy = {"available": False, "reason": "no GPU"}
    if sampler:
        sampler.stop()
        energy = sampler.summary()
    facts = {"passes": passes, "kinds": kinds, "read_sums": read_sums, "replays": replays, "energy": energy,
             "refreshes": refreshes, "passes_redone": redone,
             "context": context}
    return summarize(session, spec, cfg, facts, runner, method)


def summarize(session: Session, spec: MethodSpec, cfg: ThroughputRun, facts: dict, runner: StepDriver,
              method) -> dict:
    """Turn one method's timed passes into the row of the report (see module docstring)."""
    passes, kinds, read_sums, energy = facts["passes"], facts["kinds"], facts["read_sums"], facts["energy"]
    replays, context = facts["replays"], facts["context"]
    batch, dims = session.cache.batch, session.loaded.config
    step_seconds = [s for p in passes for s in p]
    totals = [sum(p) for p in passes]
    by_kind: dict[str, list[float]] = {}
    for kind, seconds in zip(kinds, step_seconds):
        by_kind.setdefault(kind, []).append(seconds)
    per_token = {k: float(read_sums[k]) / (len(v) * dims.num_layers * batch * dims.num_kv_heads)
                 for k, v in by_kind.items()}
    mean_read = sum(per_token[k] * len(v) for k, v in by_kind.items()) / len(kinds)
    slow_steps = len(by_kind.get("slow", []))
    # one refresh per slow row (a slow step of a batch may refresh one row or several)
    refresh = spec.config.refresh_bytes(dims, context, spec.path, session.cache_dtype_bytes)
    refresh *= facts["refreshes"] / len(kinds)
    own = spec.config.step_bytes(dims, context, session.cache_dtype_bytes) * batch
    nbytes = step_bytes(dims, mean_read, batch, session.cache_dtype_bytes, refresh, own)
    mean_step = statistics.fmean(step_seconds)
    tok_s = [batch * cfg.steps / t for t in totals]
    return {
        "method": spec.name, "path": spec.path, "context": context, "batch": batch,
        **spec.config.row_facts(),
        "tokens_per_s": statistics.median(tok_s), "tokens_per_s_spread": spread(tok_s),
        "ms_per_step": {k: {q: v * 1e3 for q, v in percentiles(s).items() if q != "n"} | {"n": len(s)}
                        for k, s in by_kind.items()},
        "mean_step_ms": mean_step * 1e3,
        "tokens_read_mean": mean_read, "tokens_read_by_kind": per_token, "retention": mean_read / (context + cfg.steps / 2),
        "bytes_per_step": nbytes.to_dict(), "achieved_gb_s": nbytes.total / mean_step / 1e9,
        "slow_steps": slow_steps, "mean_slow_interval": method.summary().get("mean_slow_interval"),
        "graphs": {"used": cfg.graphs, "replayed_steps": replays, "eager_steps": len(kinds) - replays,
                   "captured": len(runner.graphs), "capture_seconds": runner.capture_seconds,
                   "length_bucket": runner.length_bucket, "timed_passes_redone": facts["passes_redone"]},
        "peak_memory_bytes": torch.cuda.max_memory_allocated(session.device) if session.device.type == "cuda" else None,
        # beside the peak of this method's decode: what the estimate planned for it (metrics/memory.py)
        "memory_estimate": memory_record(run_estimate(session, [spec], batch, context + cfg.steps + 1,
                                                      _synthetic(cfg, context), cfg.steps)),
        # the sampler also ran through the redone passes
        "energy": energy | energy_per_token(energy, batch * cfg.steps * (cfg.repeats + facts["passes_redone"])),
    }


def add_comparisons(rows: list[dict], cfg: ThroughputRun, dims, dtype_bytes: int, bandwidth: float) -> None:
    """Speedup vs the fastest Full-KV path at the same shape, roofline efficiency and ratio, step floors.

    `speedup_supported` records reporting/speedup_claims.py's rule (the tok/s ranges over the passes apart),
    which the table, report.md and the plots apply alike."""
    for row in rows:
        row["roofline_ms"] = row["bytes_per_step"]["total"] / bandwidth * 1e3
        row["roofline_efficiency"] = row["roofline_ms"] / row["mean_step_ms"]
        if row.get("weights_floor"):  # SPEC 7: every step kind against weights floor + its K/V at copy bandwidth
            fixed = row["weights_floor"]["seconds"] + row.get("all_reduce", {}).get("step_seconds", 0.0)
            row["floor_ms"] = {kind: (fixed + kv_read_bytes(dims, read, row["batch"], dtype_bytes) / bandwidth)
                               * 1e3 for kind, read in row["tokens_read_by_kind"].items()}
        claim = speedup_claim(row, rows)
        if claim is None:
            continue
        best = full_kv_reference(row, rows)
        row["speedup_vs_full_kv"] = claim.ratio
        row["full_kv_reference_path"] = best["path"]
        row["speedup_supported"] = claim.supported
        if not registry.get(row["method"]).dense:
            w = best["bytes_per_step"]["weights"]
            kv_full = kv_read_bytes(dims, row["context"], 1, dtype_bytes)
            kv_sparse = kv_read_bytes(dims, row["tokens_read_by_kind"].get("fast", row["tokens_read_mean"]), 1, dtype_bytes)
            interval = row["mean_slow_interval"] or float("inf")
            row["roofline_speedup"] = roofline_ratio(w, kv_full, kv_sparse, row["batch"], interval)


def measure_all(session: Session, cfg: ThroughputRun, progress=None, earlier: list[dict] = (),
                own: dict[tuple, int] | None = None) -> list[dict]:
    """One row per (context, batch, method spec): the rows results.json holds, before add_comparisons.

    `progress(row)` is told of each row as it is finished, so a stopped run keeps every one. A row `earlier`
    holds (a resumed run's) is taken as it is, not measured again, and a shape whose rows it holds is not
    even prefilled; the rows come in the order an uninterrupted run makes them. `own`: each spec's own largest
    batch where the run asks for "max" (own_largest_batches; None: sized here, at the longest context)."""
    stream, tokenizer = load_replay(session.loaded.config.vocab_size, session.loaded.tokenizer)
    rows = []
    # "max" is each method's own largest batch at the longest context, used at every context
    if own is None:
        own = own_largest_batches(session, cfg, max(cfg.contexts)) if "max" in cfg.batches else {}
    fixed = [int(b) for b in cfg.batches if b != "max"]
    batches = list(dict.fromkeys(fixed + list(own.values())))
    starting(f"timing the model's own products (the weights floor) at batch "
             f"{', '.join(map(str, batches))}")
    floors = {batch: weights_floor_seconds(session.loaded.model, batch, session.device) for batch in batches}
    reduces = {batch: all_reduce_seconds(session.parallel, batch, session.loaded.config.hidden_size,
                                         2 * session.loaded.config.num_layers, session.dtype, session.device)
               for batch in batches} if session.parallel.world_size > 1 else {}
    for context in cfg.contexts:
        for batch, specs in batch_plan(method_specs(cfg, context), fixed, own).items():
            for row in measure_shape(session, cfg, context, batch, stream, tokenizer, earlier, specs, own):
                row.setdefault("weights_floor", floors[batch])
                if reduces:  # tensor parallelism: the step's all-reduces, part of its floor
                    row.setdefault("all_reduce", reduces[batch])
                rows.append(row)
                if progress:
                    progress(row)
    return rows


def finished_row(earlier, spec: MethodSpec, context: int, batch: int) -> dict | None:
    """The row of `earlier` that measured `spec` at (context, batch), or None."""
    facts = spec.config.row_facts()
    return next((r for r in earlier if (r["method"], r["path"], r["context"], r["batch"])
                 == (spec.name, spec.path, context, batch) and all(r.get(k) == v for k, v in facts.items())),
                None)


def measure_shape(session: Session, cfg: ThroughputRun, context: int, batch: int, stream: torch.Tensor,
                  tokenizer, earlier=(), specs: list[MethodSpec] | None = None, own: dict[tuple, int] | None = None):
    """Prefill one (context, batch) and yield a row per method spec of `specs` (default: the run's at this
    context; a row `earlier` holds as it is). The methods that read the whole cache share one prefill; each
    that keeps only part of each prompt then gets its own compact cache (engine/compact.py), the shared cache
    freed first. Snapshots and inputs live only here, so the next shape's prefill starts with nothing of this
    one's allocated. `own`: each spec's own largest batch, where the run asked for "max" (rows measured at it
    say so: the equal-memory view's rows)."""
    specs = method_specs(cfg, context) if specs is None else specs
    dims = session.loaded.config
    kept = {id(spec): finished_row(earlier, spec, context, batch) for spec in specs}
    whole = [spec for spec in specs if not uses_compact_cache(spec.config, spec.path, dims)]
    compact = [spec for spec in specs if uses_compact_cache(spec.config, spec.path, dims)]
    # every spec's rows come in the order of `specs` within each group, the whole-cache group first
    inputs = step_inputs(take_rows(stream, context, batch, cfg.steps + 1), session.device) \
        if not all(kept[id(spec)] for spec in specs) else None
    if whole and not all(kept[id(spec)] for spec in whole):
        prefill_kind = "synthetic" if _synthetic(cfg, context) else "real"
        starting(f"prefill of {context:,} tokens x {batch} ({prefill_kind})")
        prefilled, synthetic, prefill_seconds = prepare_cache(session, cfg, context, batch, stream, seed=0)
        prefill_peak = torch.cuda.max_memory_allocated(session.device) if session.device.type == "cuda" else None
    for spec in whole:
        row = kept[id(spec)] or timed_row(session, cfg, spec, specs, context, batch, prefilled, inputs, tokenizer,
                                          synthetic, prefill_seconds, prefill_peak)
        yield marked(row, spec, batch, own)
    prefilled = None
    for spec in compact:
        row = kept[id(spec)]
        if row is None:
            starting(f"prefill of {context:,} tokens x {batch}, one at a time, into {spec.name}'s compact cache")
            method, prefilled, synthetic, prefill_seconds = prepare_compact_cache(session, cfg, spec, context,
                                                                                  batch, stream, tokenizer)
            prefill_peak = torch.cuda.max_memory_allocated(session.device) if session.device.type == "cuda" else None
            row = timed_row(session, cfg, spec, specs, context, batch, prefilled, inputs, tokenizer, synthetic,
                            prefill_seconds, prefill_peak, method)
            prefilled = method = None
        yield marked(row, spec, batch, own)


def timed_row(session: Session, cfg: ThroughputRun, spec: MethodSpec, specs: list[MethodSpec], context: int,
              batch: int, prefilled: Prefilled, inputs: torch.Tensor, tokenizer, synthetic: bool,
              prefill_seconds: float, prefill_peak: int | None, method=None) -> dict:
    # a method timed in several variants on a path (the optimized SFI's publishing) names the variant
    several = sum((other.name, other.path) == (spec.name, spec.path) for other in specs) > 1
    variant = " ".join(str(value) for value in spec.config.row_facts().values()) if several else ""
    starting(f"{spec.name}{' ' + variant if variant else ''}/{spec.path} at {context:,} tokens, B={batch}: "
             f"1 warm-up + {cfg.repeats} timed passes of {cfg.steps} steps")
    row = measure(session, prefilled, spec, cfg, inputs, tokenizer, context, method)
    row["prefill"] = "synthetic" if synthetic else "real"
    row["prefill_seconds"] = prefill_seconds
    row["prefill_peak_memory_bytes"] = prefill_peak  # weights, cache and the prefill's transients
    return row


def prepare_compact_cache(session: Session, cfg: ThroughputRun, spec: MethodSpec, context: int, batch: int,
                          stream: torch.Tensor, tokenizer, seed: int = 0):
    """prepare_cache for a method that keeps only part of each prompt: the shared cache freed, each prompt
    prefilled alone (really, or synthetically with its own seed) and compacted (engine/compact.py) into
    `session.cache`. Returns the method that chose what was kept, the snapshot, whether it was synthetic and
    the prefill's wall time in seconds (selection and copies included)."""
    steps, dims, max_seq = cfg.steps, session.loaded.config, context + cfg.steps + 1
    synthetic = _synthetic(cfg, context)
    session.cache = None
    if session.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(session.device)
    _check_session_fits(session, [spec], batch, max_seq, synthetic, steps)
    _check_limit(session, context, steps)
    method = registry.create_method(spec, dims, tokenizer)
    prompts = None if synthetic else take_rows(stream, 0, batch, context)

    def fill(prompt_cache, row: int) -> Prefilled:
        if synthetic:
            return synthetic_prefill(prompt_cache, context, dims.vocab_size, dims.num_heads, EVIDENCE_ROWS, seed + row)
        return prefill(session.loaded.model, prompt_cache, [prompts[row].tolist()], evidence_rows=EVIDENCE_ROWS)

    slots = compact_slots(spec.config, spec.path, dims, max_seq, steps + 1)
    _synchronize(session.device)
    began = time.perf_counter()
    session.cache, prefilled = compact_prefill(method, slots, [context] * batch, session.device, session.dtype, fill)
    _synchronize(session.device)
    return method, prefilled, synthetic, time.perf_counter() - began
