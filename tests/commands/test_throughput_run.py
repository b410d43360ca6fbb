"""`sfibench throughput` hands its runner one frozen ThroughputRun, `--ctx max` resolved once from the model's
shape and the methods resolved to (method, path) pairs, and results.json's config keeps the keys committed
runs were written with."""

from __future__ import annotations

import json
from pathlib import Path

from no_model import forbid_model_loading
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.budget import Budget
from sfibench.models.presets import PRESETS
from sfibench.runners import throughput
from sfibench.runners.throughput_run import ThroughputRun, resolve_contexts
from sfibench.sfi.config import SFIConfig

COMMITTED = Path(__file__).resolve().parents[2] / "reports" / "ci" / "throughput" / "results.json"


class RunSeen(Exception):
    pass


def handed_run(monkeypatch, *args: str) -> ThroughputRun:
    forbid_model_loading(monkeypatch)

    def stop(run, *rest):
        raise RunSeen(run)

    monkeypatch.setattr(throughput, "run_throughput", stop)
    result = CliRunner().invoke(app, ["throughput", "--model", "tiny-llama", "--device", "cpu", *args])
    assert isinstance(result.exception, RunSeen), result.output
    return result.exception.args[0]


def test_max_is_resolved_once_from_the_shape_before_the_runner(monkeypatch):
    run = handed_run(monkeypatch, "--ctx", "1k,max", "--steps", "8", "--methods", "full_kv,sfi")
    assert run.contexts == (1024, PRESETS["tiny-llama"].max_context - 8)
    assert run.methods == (("full_kv", "reference"), ("sfi", "reference"))


def test_results_config_keeps_the_committed_keys():
    run = ThroughputRun(model="tiny-llama", contexts=(1024,), batches=(1,), methods=(("sfi", "reference"),),
                        steps=8, k_head=Budget(percent=10.0), sfi=SFIConfig())
    record = run.record("tiny-llama")
    committed = json.loads(COMMITTED.read_text())["config"]
    # publish: a key of runs written before SFI's publish modes were rows of their own
    assert set(committed) - {"publish"} <= set(record)
    assert record["sfi"].k_head == "10%" and record["budget"] is None
    assert run.at(1000).sfi.k_head == 100  # a percentage resolved at each context


def test_contexts_resolve_max_and_keep_the_rest():
    assert resolve_contexts(("max", 512), 4096, 32) == (4064, 512)
