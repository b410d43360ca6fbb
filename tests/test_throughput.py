"""The throughput harness on the CPU: a tiny end-to-end run, its numbers' consistency, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from sfibench.cli import app, parse_tokens
from sfibench.engine.cache import KVCache
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.metrics.memory import MemoryEstimateError
from sfibench.reporting.throughput_cli import resolve_methods
from sfibench.reporting.throughput_run import ThroughputConfig, prepare_cache, run_throughput
from sfibench.workloads.replay import ReplayTokenizer, load_replay, take

runner = CliRunner()


def test_parse_tokens():
    assert parse_tokens("8k") == 8192 and parse_tokens("128K") == 131072 and parse_tokens("3000") == 3000
    with pytest.raises(ValueError, match="not a token count"):
        parse_tokens("lots")


def test_replay_stream_carries_real_sentence_boundaries():
    stream, tokenizer = load_replay(151936, None)
    assert isinstance(tokenizer.backend, ReplayTokenizer) and stream.numel() > 10000
    text = tokenizer.decode(stream[:400].tolist())
    assert text.count(". ") >= 5  # natural sentences, so SFI's triggers fire at natural rates
    assert torch.equal(take(stream, stream.numel() - 2, 4), torch.cat([stream[-2:], stream[:2]]))


def test_synthetic_prefill_fills_exactly_the_context():
    session = Session.open("tiny-llama", "cpu")
    cache = KVCache(session.loaded.config, 2, 100, "cpu", torch.float32)
    pre = synthetic_prefill(cache, 80, session.loaded.config.vocab_size, session.loaded.config.num_heads, 16)
    assert cache.lengths_host.tolist() == [80, 80] and pre.queries.shape[3] == 16
    assert cache.k[:, :, :, :80].abs().sum(-1).min() > 0 and cache.k[:, :, :, 80:].abs().sum() == 0
    assert torch.allclose(cache.key_norms[..., :80], cache.k[..., :80, :].norm(dim=-1))


def test_tiny_run_reports_consistent_numbers():
    session = Session.open("tiny-qwen3", "cpu")
    cfg = ThroughputConfig(model="tiny-qwen3", contexts=[2900], batches=[2],
                           methods=[("full_kv", "reference"), ("sfi", "reference")], steps=40, repeats=2,
                           graphs=False)
    rows = run_throughput(session, cfg)
    dense, sfi = rows
    assert dense["tokens_read_mean"] == pytest.approx(2900 + 20.5, abs=0.01)  # every slot, every step
    assert sfi["tokens_read_mean"] < dense["tokens_read_mean"]
    assert sum(v["n"] for v in sfi["ms_per_step"].values()) == 40 * 2  # steps x timed passes
    assert sfi["slow_steps"] == sfi["ms_per_step"].get("slow", {"n": 0})["n"]
    assert dense["bytes_per_step"]["kv_read"] > sfi["bytes_per_step"]["kv_read"]
    assert dense["prefill"] == "real" and dense["graphs"]["used"] is False


def test_memory_estimate_refuses_before_allocating():
    session = Session.open("qwen3-0.6b", "cpu", dtype="bfloat16")
    with pytest.raises(MemoryEstimateError, match="fits"):
        prepare_cache(session, 131072, 64, 8, "synthetic", torch.arange(10), seed=0)
    assert session.cache is None


def test_unknown_methods_and_paths_are_refused():
    with pytest.raises(ValueError, match="valid methods"):
        resolve_methods(["h2o"], ["reference"])
    with pytest.raises(ValueError, match="valid paths"):
        resolve_methods(["sfi"], ["turbo"])


def test_cli_default_writes_a_report_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["throughput", "--ctx", "1k", "--steps", "8", "--repeats", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in saved["results"]["rows"]} == {"full_kv", "sfi", "streaming_llm", "snapkv"}
    assert (out / "report.md").read_text().startswith("# sfibench throughput")
    before = (out / "results.json").read_bytes()
    again = runner.invoke(app, ["throughput", "--ctx", "1k", "--steps", "8", "--out", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output
    assert (out / "results.json").read_bytes() == before
    bad = runner.invoke(app, ["throughput", "--ctx", "64k", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "limit" in bad.output


def test_method_path_pinning():
    pairs = resolve_methods(["full_kv/optimized", "sfi"], ["reference", "optimized"])
    assert pairs == [("full_kv", "optimized"), ("sfi", "reference")]


def test_profile_breaks_a_step_into_components(tmp_path):
    out = tmp_path / "profile"
    result = runner.invoke(app, ["profile", "--ctx", "3000", "--steps", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())["results"]
    parts = saved["ms_per_step"]
    assert {"attention", "MLP", "SFI selector", "other model ops"} <= set(parts)
    assert parts["attention"] > 0 and parts["MLP"] > 0
    assert sum(parts.values()) == pytest.approx(saved["wall_ms_per_step"], rel=0.05)
    assert (out / "profile.png").exists()
    bad = runner.invoke(app, ["profile", "--method", "h2o", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "valid methods" in bad.output
