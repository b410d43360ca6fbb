"""The memory estimate against torch.cuda.max_memory_allocated on a GPU, two presets at small contexts:
every method's optimized decode (CUDA graphs on) peaks within 10% of what the estimate planned for it."""

from __future__ import annotations

import pytest
import torch

from sfibench import registry
from sfibench.engine.session import Session
from sfibench.runners.throughput_measure import measure_all
from sfibench.runners.throughput_run import ThroughputRun

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("model", ["qwen3-0.6b", "qwen3-1.7b"])
def test_every_methods_peak_is_its_estimate(model):
    session = Session.open(model, "cuda")
    methods = [(name, "optimized") for name in registry.names() if (name, "optimized") in registry.available()]
    cfg = ThroughputRun(model=model, contexts=[16384], batches=[2], methods=methods, steps=32, repeats=1,
                           prefill="synthetic")
    rows = measure_all(session, cfg)
    assert rows
    for row in rows:
        estimate = row["memory_estimate"]["decode_total"]
        assert row["peak_memory_bytes"] == pytest.approx(estimate, rel=0.10), (row["method"], row.get("publish"))


def test_a_real_prefills_peak_is_its_estimate():
    """A real prefill of four chunks (8K tokens, each chunk after the first with its additive mask over every
    key so far): torch's peak from the cache's allocation to the prefill's end (weights, cache, key norms,
    the snapshot and a chunk's transients) is what the estimate plans for that phase, within 10%. The second
    shape's peak is its own: the first shape's larger cache is freed before it is counted."""
    session = Session.open("qwen3-0.6b", "cuda")
    cfg = ThroughputRun(model="qwen3-0.6b", contexts=[8192], batches=[4, 1], methods=[("full_kv", "optimized")],
                           steps=32, repeats=1, prefill="real")
    rows = measure_all(session, cfg)
    assert [row["batch"] for row in rows] == [4, 1]
    for row in rows:
        assert row["prefill"] == "real"
        estimate = row["memory_estimate"]
        planned = sum(estimate[part] for part in ("weights", "kv_cache", "key_norms", "snapshot",
                                                  "prefill_workspace"))
        assert row["prefill_peak_memory_bytes"] == pytest.approx(planned, rel=0.10), row["batch"]
