"""Memory of the methods that keep only part of each prompt (engine/compact.py): the estimate counts what they
hold (a compact cache of the batch, and one prompt's whole cache while the prompts are prefilled), the CPU
allocator's peak follows it, and `--batch max` gives each method its own largest batch."""

from __future__ import annotations

import pytest
from allocator import AllocatorPeak

from sfibench.core.budget import Budget
from sfibench.engine.session import Session
from sfibench.metrics.memory import MARGIN, estimate_memory, largest_batch, planning_bytes
from sfibench.models.presets import get_preset
from sfibench.runners.throughput_batches import batch_plan, spec_key
from sfibench.runners.throughput_measure import (
    measure,
    measure_all,
    method_specs,
    prepare_cache,
    prepare_compact_cache,
)
from sfibench.runners.throughput_memory import method_bytes, run_estimate, spec_bytes
from sfibench.runners.throughput_run import ThroughputRun
from sfibench.workloads.replay import load_replay, step_inputs, take_rows

H200_BYTES = int(139.8 * 2**30)
STEPS = 128
LONGEST = 131072 - STEPS


def whole_cache_estimate(spec, dims, batch: int, max_seq: int, steps: int, dtype_bytes: int) -> dict:
    """The estimate of `spec` decoding from the whole cache (its state and workspace as it declares them)."""
    token, sequence = spec.config.state_bytes(dims, spec.path, dtype_bytes, 16)
    workspace = spec.config.workspace_bytes(dims, spec.path, dtype_bytes, batch, max_seq, max_seq - steps - 1)
    return estimate_memory(dims, batch, max_seq, dtype_bytes, steps=steps, method_token_bytes=token,
                           method_sequence_bytes=sequence, method_workspace_bytes=workspace)


@pytest.mark.parametrize("name", ["streaming_llm", "snapkv"])
def test_the_cpu_allocators_peak_falls_as_the_estimate_says(name):
    """A throughput run's compact cache (prompts prefilled one at a time, synthetically, then decoded on the
    optimized path in Triton's interpreter) against the same method decoding from the whole cache: each peak of
    torch's CPU allocator, plus the weights, is its estimate within 10%, and the compact one is several times
    smaller, as its estimate says."""
    model, context, batch = "tiny-qwen3", 4000, 8
    session = Session.open(model, "cpu", dtype="float32")
    dims, weights = session.loaded.config, session.loaded.config.num_params() * 4
    cfg = ThroughputRun(model=model, contexts=[context], batches=[batch], methods=[(name, "optimized")], steps=2,
                        repeats=1, prefill="synthetic", graphs=False, budget=Budget(tokens=128)).at(context)
    stream, tokenizer = load_replay(dims.vocab_size, session.loaded.tokenizer)
    inputs = step_inputs(take_rows(stream, context, batch, cfg.steps + 1), session.device)
    (spec,), max_seq = method_specs(cfg, context), context + cfg.steps + 1
    with AllocatorPeak() as compact:
        method, snapshot, _, _ = prepare_compact_cache(session, cfg, spec, context, batch, stream, tokenizer)
        measure(session, snapshot, spec, cfg, inputs, tokenizer, context, method)
    assert session.cache.max_seq == spec.config.budget + cfg.steps + 1
    del method, snapshot
    session.cache = None
    with AllocatorPeak() as whole:
        snapshot, _, _ = prepare_cache(session, cfg, context, batch, stream, seed=0)
        measure(session, snapshot, spec, cfg, inputs, tokenizer, context)
    planned_compact = run_estimate(session, [spec], batch, max_seq, True, cfg.steps)["total"]
    planned_whole = whole_cache_estimate(spec, dims, batch, max_seq, cfg.steps, 4)["total"]
    assert compact.peak + weights == pytest.approx(planned_compact, rel=0.10)
    assert whole.peak + weights == pytest.approx(planned_whole, rel=0.10)
    assert planned_whole > 4 * planned_compact
    assert (whole.peak + weights) / (compact.peak + weights) == pytest.approx(planned_whole / planned_compact,
                                                                              rel=0.10)


def test_snapkv_at_15_percent_fits_several_times_full_kvs_batch_at_128k_on_an_h200():
    """By arithmetic on qwen3-4b: SnapKV keeping 15% of a 128K prompt decodes from a compact cache, so its own
    largest batch is several times Full-KV's; the estimate of that batch fits and one more does not."""
    dims, planned = get_preset("qwen3-4b"), planning_bytes(H200_BYTES, H200_BYTES)
    assert planned == int(MARGIN * H200_BYTES)
    cfg = ThroughputRun(model="qwen3-4b", contexts=[LONGEST], batches=["max"], steps=STEPS,
                        methods=[("full_kv", "optimized"), ("snapkv", "optimized")],
                        budget=Budget(percent=15)).at(LONGEST)
    full, snap = method_specs(cfg, LONGEST)
    assert snap.config.budget == 19642  # 15% of 130,944 tokens
    slots = LONGEST + STEPS + 1

    def own(spec):
        def method_at(batch, max_seq):
            return method_bytes([spec], dims, 2, batch, max_seq, STEPS, synthetic=True, gpu=True)
        first = estimate_memory(dims, 1, slots, 2, gpu=True, steps=STEPS, **method_at(1, slots))
        batch = largest_batch(first, planned, method_at)
        total = [estimate_memory(dims, b, slots, 2, gpu=True, steps=STEPS, **method_at(b, slots))["total"]
                 for b in (batch, batch + 1)]
        assert total[0] <= planned < total[1]
        return batch

    assert spec_bytes(snap, dims, 2, 1, slots, STEPS)["compact_slots"] == snap.config.budget + STEPS + 1
    assert spec_bytes(full, dims, 2, 1, slots, STEPS)["compact_slots"] == 0
    full_batch, snap_batch = own(full), own(snap)
    assert full_batch == 6 and snap_batch > 5 * full_batch  # 38 at the margin's 132.8 GiB
    # together, a run's estimate is its largest method's: Full-KV's
    assert method_bytes([full, snap], dims, 2, 6, slots, STEPS, synthetic=True, gpu=True)["compact_slots"] == 0


def test_batch_max_runs_each_method_at_its_own_largest_batch_beside_the_fixed_ones():
    cfg = ThroughputRun(model="tiny-qwen3", contexts=[1000], batches=[2, "max"], steps=4,
                        methods=[("full_kv", "optimized"), ("snapkv", "optimized")])
    full, snap = method_specs(cfg, 1000)
    plan = batch_plan([full, snap], [2], {spec_key(full): 2, spec_key(snap): 9})
    assert plan == {2: [full, snap], 9: [snap]}  # Full-KV's largest is the fixed batch: measured once


def test_a_run_measures_the_compact_method_on_its_own_cache_and_marks_its_largest_batch():
    """measure_all on the CPU: the whole-cache method shares one prefill, the compact one gets its own cache
    (prefilled for real, a prompt at a time); a row at a method's own largest batch says so, and each row's
    memory estimate is its own method's."""
    session = Session.open("tiny-qwen3", "cpu", dtype="float32")
    cfg = ThroughputRun(model="tiny-qwen3", contexts=[600], batches=[2, "max"], steps=3, repeats=1, graphs=False,
                        methods=[("full_kv", "reference"), ("snapkv", "optimized")],
                        budget=Budget(tokens=128)).at(600)
    snap = method_specs(cfg, 600)[1]
    rows = measure_all(session, cfg, own={spec_key(snap): 3})
    assert [(r["method"], r["batch"], r["largest_batch"]) for r in rows] == [
        ("full_kv", 2, False), ("snapkv", 2, False), ("snapkv", 3, True)]
    assert all(r["prefill"] == "real" for r in rows)
    whole, compact = rows[0]["memory_estimate"], rows[1]["memory_estimate"]
    assert whole["prompt_cache"] == 0 < compact["prompt_cache"] and compact["kv_cache"] < whole["kv_cache"]
    assert session.cache.max_seq == snap.config.budget + cfg.steps + 1  # the last row decoded from a compact cache
