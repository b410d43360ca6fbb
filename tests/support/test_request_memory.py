"""Memory of `sfibench throughput`'s request mode for the methods that keep only part of each prompt: request
mode serves every method from the whole cache of P + G tokens, so its estimate (the row's, and the one its
memory check and `--batch max` plan with) counts that whole cache, and the CPU allocator's peak follows it."""

from __future__ import annotations

import pytest
from allocator import AllocatorPeak

from sfibench.core.budget import Budget
from sfibench.engine.session import Session
from sfibench.runners import throughput_memory
from sfibench.runners.throughput_measure import largest_batch, method_specs
from sfibench.runners.throughput_memory import run_estimate
from sfibench.runners.throughput_requests import measure_requests
from sfibench.runners.throughput_run import ThroughputRun


@pytest.mark.parametrize("name", ["streaming_llm", "snapkv"])
def test_request_modes_estimate_is_the_whole_cache_it_allocates(name, monkeypatch):
    """Requests of an eviction method on the optimized path (Triton's interpreter): the cache they decode from
    holds every prompt token of every sequence, and the allocator's peak plus the weights is the row's
    estimate within 10%, which is the run's estimate at that shape and several times a compact cache's.
    `--batch max` plans with the same estimate: with room for exactly this batch's, it is the largest."""
    model, prompt, gen, batch = "tiny-qwen3", 4000, 3, 8
    session = Session.open(model, "cpu", dtype="float32")
    weights = session.loaded.config.num_params() * 4
    run = ThroughputRun(model=model, contexts=(prompt,), batches=(batch,), methods=((name, "optimized"),),
                        steps=gen, repeats=1, prefill="synthetic", graphs=False, budget=Budget(tokens=128),
                        requests=True, text="replay").at(prompt)
    with AllocatorPeak() as seen:
        (row,) = measure_requests(session, run)
    assert (session.cache.batch, session.cache.max_seq) == (batch, prompt + gen + 1)
    estimate = row["memory_estimate"]
    assert seen.peak + weights == pytest.approx(estimate["total"], rel=0.10)
    max_seq, specs = prompt + gen + 1, method_specs(run, prompt)
    assert estimate["total"] == run_estimate(session, specs, batch, max_seq, True, gen, compact=False)["total"]
    assert estimate["total"] > 4 * run_estimate(session, specs, batch, max_seq, True, gen)["total"]
    monkeypatch.setattr(throughput_memory, "planned_bytes", lambda _: estimate["total"])
    assert largest_batch(session, run, prompt) == batch
