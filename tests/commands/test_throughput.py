"""The throughput harness on the CPU: a tiny end-to-end run, its numbers' consistency, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from sfibench import registry
from sfibench.cli import app
from sfibench.engine.cache import KVCache
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.metrics.memory import MemoryEstimateError
from sfibench.metrics.nvml import energy_per_token
from sfibench.commands.options import parse_tokens
from sfibench.reporting.throughput_report import latency_energy_rows
from sfibench.runners.throughput import resolve_methods
from sfibench.runners.throughput_measure import measure_all, prepare_cache
from sfibench.runners.throughput_run import ThroughputRun
from sfibench.sfi.config import SFIConfig, TriggerConfig
from sfibench.workloads.replay import ReplayTokenizer, load_replay, take, take_rows

runner = CliRunner()


def test_parse_tokens():
    assert parse_tokens("8k", "--ctx") == 8192 and parse_tokens("128K", "--ctx") == 131072
    assert parse_tokens("3000", "--ctx") == 3000
    with pytest.raises(ValueError, match="--ctx 'lots' is not a token count"):
        parse_tokens("lots", "--ctx")


def _row(method: str, tok_s: list[float], read: float) -> dict:
    """A results row as `summarize` writes it, with only what `add_comparisons` reads."""
    return {"method": method, "path": "reference", "context": 4096, "batch": 1, "tokens_read_mean": read,
            "tokens_per_s": sorted(tok_s)[1],
            "tokens_per_s_spread": {"min": min(tok_s), "max": max(tok_s), "rel_spread": (max(tok_s) - min(tok_s)) / sorted(tok_s)[1]},
            "bytes_per_step": {"total": 1e6, "weights": 5e5}, "mean_step_ms": 1.0, "tokens_read_by_kind": {"sparse": read},
            "ms_per_step": {"sparse": {"p50": 1.0}}, "achieved_gb_s": 1.0,
            "mean_slow_interval": None}  # a method without slow steps


@pytest.mark.parametrize("sparse_read,sparse_tok_s,supported,cell", [
    (4096, [30.0, 31.0, 32.0], True, "2.82x (same tokens)"),  # measured, and marked: it reads every token
    (1000, [10.5, 11.0, 11.5], False, "= in the noise"),  # fewer tokens, but the tok/s ranges overlap
    (1000, [30.0, 31.0, 32.0], True, "2.82x"),  # fewer tokens and clearly separated
])
def test_speedup_is_claimed_only_where_the_run_supports_it(sparse_read, sparse_tok_s, supported, cell):
    from sfibench.reporting.throughput_report import table_rows
    from sfibench.runners.throughput_measure import add_comparisons

    dims = Session.open("tiny-llama", "cpu").loaded.config
    rows = [_row("full_kv", [10.0, 11.0, 12.0], 4096), _row("streaming_llm", sparse_tok_s, sparse_read)]
    cfg = ThroughputRun(model="tiny-llama", contexts=[4096], batches=[1], methods=[], steps=8)
    add_comparisons(rows, cfg, dims, 4, bandwidth=1e10)
    assert rows[1]["speedup_supported"] is supported
    # every sparse row gets its roofline speedup; K and V of a token: 2 layers x 2 KV heads x 2 x 16 dims x 4 bytes
    assert rows[1]["roofline_speedup"] == pytest.approx((5e5 + 4096 * 512) / (5e5 + sparse_read * 512))
    assert table_rows(rows)[1][-2] == cell
    assert table_rows(rows)[0][-2] == "ref"  # the Full-KV row every ratio at this shape is measured against


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
    cfg = ThroughputRun(model="tiny-qwen3", contexts=[2900], batches=[2],
                           methods=[("full_kv", "reference"), ("sfi", "reference")], steps=40, repeats=2,
                           graphs=False)
    rows = measure_all(session, cfg)
    dense, sfi = rows
    assert dense["tokens_read_mean"] == pytest.approx(2900 + 20.5, abs=0.01)  # every slot, every step
    assert sfi["tokens_read_mean"] < dense["tokens_read_mean"]
    assert sum(v["n"] for v in sfi["ms_per_step"].values()) == 40 * 2  # steps x timed passes
    assert sfi["slow_steps"] == sfi["ms_per_step"].get("slow", {"n": 0})["n"]
    assert dense["bytes_per_step"]["kv_read"] > sfi["bytes_per_step"]["kv_read"]
    assert dense["prefill"] == "real" and dense["graphs"]["used"] is False


def test_a_timed_pass_that_captured_a_graph_is_run_again(monkeypatch):
    """A capture inside a timed pass (a plan first met there) times the capture, not decoding: that pass is
    discarded and run again, and the row says so."""
    from sfibench.runners import throughput_measure

    class CapturesInFirstTimedPass(throughput_measure.StepDriver):
        starts = 0

        def start(self, prefilled):
            super().start(prefilled)
            type(self).starts += 1

        def step(self, tokens):
            if type(self).starts == 2 and self.step_index == 3:  # pass 0 warms up; pass 1 "captures"
                self.capture_seconds += 0.5
            return super().step(tokens)

    monkeypatch.setattr(throughput_measure, "StepDriver", CapturesInFirstTimedPass)
    session = Session.open("tiny-qwen3", "cpu")
    cfg = ThroughputRun(model="tiny-qwen3", contexts=[600], batches=[1], methods=[("full_kv", "reference")],
                           steps=12, repeats=2, graphs=False)
    row = measure_all(session, cfg)[0]
    assert CapturesInFirstTimedPass.starts == 4  # warm-up, the discarded pass, two kept ones
    assert row["graphs"]["timed_passes_redone"] == 1
    assert row["tokens_per_s_spread"]["n"] == 2 and row["ms_per_step"]["dense"]["n"] == 12 * 2


def test_each_step_is_fed_a_contiguous_row_of_its_own_tokens(monkeypatch):
    """A column of the [B, N] stream is a strided view: on a GPU its copy goes through fresh pageable memory,
    which drains the stream every step (workloads/replay.step_inputs). The driver must get contiguous rows,
    and the tokens of that step."""
    from sfibench.runners import throughput_measure

    fed = []

    class Recording(throughput_measure.StepDriver):
        def step(self, tokens):
            fed.append((tokens.is_contiguous(), tokens.clone()))
            return super().step(tokens)

    monkeypatch.setattr(throughput_measure, "StepDriver", Recording)
    session = Session.open("tiny-qwen3", "cpu")
    cfg = ThroughputRun(model="tiny-qwen3", contexts=[600], batches=[3], methods=[("full_kv", "reference")],
                           steps=5, repeats=1, graphs=False)
    measure_all(session, cfg)
    stream, _ = load_replay(session.loaded.config.vocab_size, session.loaded.tokenizer)
    expected = take_rows(stream, 600, 3, 6)
    assert len(fed) == 2 * 5  # a warm-up pass and a timed one
    for index, (contiguous, tokens) in enumerate(fed):
        assert contiguous
        assert torch.equal(tokens, expected[:, index % 5])


def test_refresh_bytes_follow_layer_groups():
    # Under layer_groups = 2 a refresh re-selects every other global layer, so its extra traffic halves;
    # the triggers (and so the number of refreshes) do not depend on the selection.
    session = Session.open("tiny-qwen3", "cpu")
    refresh = {}
    for groups in (1, 2):
        sfi = SFIConfig(layer_groups=groups, trigger=TriggerConfig(policy="fixed", interval=8))
        cfg = ThroughputRun(model="tiny-qwen3", contexts=[2900], batches=[1], methods=[("sfi", "reference")],
                               steps=40, repeats=1, graphs=False, sfi=sfi)
        row = measure_all(session, cfg)[0]
        assert row["slow_steps"] > 0
        refresh[groups] = (row["bytes_per_step"]["refresh"], row["slow_steps"])
    assert refresh[1][1] == refresh[2][1]
    assert refresh[2][0] == pytest.approx(refresh[1][0] / 2)


def test_memory_estimate_refuses_before_allocating():
    session = Session.open("qwen3-0.6b", "cpu", dtype="bfloat16")
    with pytest.raises(MemoryEstimateError, match="fits"):
        cfg = ThroughputRun(model="qwen3-0.6b", contexts=[131072], batches=[64], methods=[("full_kv", "reference")],
                               steps=8, prefill="synthetic")
        prepare_cache(session, cfg, 131072, 64, torch.arange(10), seed=0)
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
    assert {r["method"] for r in saved["results"]["rows"]} == set(registry.names())  # every method by default
    assert all(r["prefill"] == "real" and r["prefill_seconds"] > 0 for r in saved["results"]["rows"])
    report = (out / "report.md").read_text()
    assert report.startswith("# sfibench throughput") and "1,024 x 1 real" in report
    before = (out / "results.json").read_bytes()
    again = runner.invoke(app, ["throughput", "--ctx", "1k", "--steps", "8", "--out", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output
    assert (out / "results.json").read_bytes() == before
    bad = runner.invoke(app, ["throughput", "--ctx", "64k", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "limit" in bad.output


def test_latency_table_has_a_line_per_step_kind_and_energy_from_the_counter():
    ms = {"p50": 6.0, "p90": 6.5, "p99": 7.0, "max": 9.0}
    row = {"method": "sfi", "path": "reference", "context": 8192, "batch": 2,
           "ms_per_step": {"fast": ms | {"n": 360}, "slow": ms | {"n": 24}},
           "peak_memory_bytes": 3 * 2**30,
           "energy": {"duration_s": 1.5, "energy_j": 264.0, "energy_j_counter": 384.0}}
    row["energy"] |= energy_per_token(row["energy"], 2 * 128 * 3)  # as summarize stores it
    fast, slow = latency_energy_rows([row])
    # 384 J (the counter, not the 264 J integral) over 2 sequences x 384 tokens = 0.5 J per token, and
    # over 1.5 s = 256 W; memory, power and energy appear once per row.
    assert fast == ("sfi", "reference", "8,192", "2", "fast", "360", "6.00", "6.50", "7.00", "9.00",
                    "3.0", "256", "0.500")
    assert slow[4:6] == ("slow", "24") and slow[-3:] == ("", "", "")
    cpu_row = row | {"peak_memory_bytes": None, "energy": {"available": False, "reason": "no GPU"}}
    assert latency_energy_rows([cpu_row])[0][-3:] == ("-", "-", "-")


def test_method_path_pinning():
    pairs = resolve_methods(["full_kv/optimized", "sfi"], ["reference", "optimized"])
    assert pairs == [("full_kv", "optimized"), ("sfi", "reference"), ("sfi", "optimized")]
    assert resolve_methods(["sfi/reference", "snapkv"], ["optimized"]) == [("sfi", "reference"), ("snapkv", "optimized")]


def test_profile_breaks_a_step_of_every_kind_into_components(tmp_path, capfd):
    """No arguments beyond a short run: SFI's fast step and a slow step with its Selector stages, each
    kind holding only what ran in it, no profiler chatter on stderr, and the same steps timed unprofiled."""
    out = tmp_path / "profile"
    result = runner.invoke(app, ["profile", "--ctx", "3000", "--steps", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "USDT" not in capfd.readouterr().err
    saved = json.loads((out / "results.json").read_text())["results"]
    fast, slow = saved["by_kind"]["fast"], saved["by_kind"]["slow"]
    assert {"attention", "MLP", "q/k/v/o projections", "sparse index build", "other model ops"} <= set(fast["ms_per_step"])
    assert not any(name.startswith("selector") for name in fast["ms_per_step"])  # a fast step runs no Selector
    assert {"selector: top-K", "selector: evidence logits"} <= set(slow["ms_per_step"])
    assert saved["step_kinds"].count("fast") == 4 and saved["step_kinds"].count("slow") >= 1
    for part in (fast, slow):
        assert part["ms_per_step"]["attention"] > 0
        assert sum(part["ms_per_step"].values()) == pytest.approx(part["wall_ms_per_step"], rel=0.05)
    assert saved["ms_per_step"] == fast["ms_per_step"]  # the main kind, as graphed runs and the gate read it
    assert set(saved["step_ms_by_kind"]) == {"fast", "slow"}
    report = (out / "report.md").read_text()
    assert "## slow step" in report and "Without the profiler" in report and "profiler's own cost" in report
    assert (out / "profile.png").exists()
    bad = runner.invoke(app, ["profile", "--method", "h2o", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "valid methods" in bad.output


def test_profile_decodes_a_batch_and_says_so(tmp_path, monkeypatch):
    from sfibench.engine.driver import StepDriver

    widths = []
    step = StepDriver.step
    monkeypatch.setattr(StepDriver, "step", lambda self, tokens: widths.append(tokens.shape) or step(self, tokens))
    out = tmp_path / "profile"
    result = runner.invoke(app, ["profile", "--ctx", "2000", "--steps", "3", "--batch", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert set(widths) == {torch.Size([2])}  # every step fed both rows
    saved = json.loads((out / "results.json").read_text())
    assert saved["config"]["batch"] == 2 and saved["results"]["batch"] == 2
    assert "at 2,000 tokens, B = 2" in (out / "report.md").read_text()
    too_many = runner.invoke(app, ["profile", "--ctx", "2000", "--steps", "3", "--batch", "10000000",
                                   "--out", str(tmp_path / "huge")])
    assert too_many.exit_code == 2 and "lower the batch size" in " ".join(too_many.output.split())
    assert not (tmp_path / "huge").exists()  # refused before anything was written


def test_profile_rows_are_exclusive_times():
    from sfibench.runners.profile import LABELS, exclusive_times

    inclusive = {name: 0.0 for name, _ in LABELS.values()}
    inclusive.update({"attention": 10.0, "sparse index build": 1.0, "selector: glue": 6.0,
                      "selector: soft-NMS": 2.0, "selector: top-K": 3.0, "MLP": 4.0})
    own = exclusive_times(inclusive)
    assert own["attention"] == 9.0  # 10 - index build 1 (the Selector runs after the step, outside attention)
    assert own["selector: glue"] == 1.0  # 6 - NMS 2 - top-K 3
    assert own["MLP"] == 4.0 and own["selector: soft-NMS"] == 2.0
    outermost = sum(inclusive[name] for name, parent in LABELS.values() if parent is None)
    assert sum(own.values()) == outermost  # nothing counted twice, nothing lost


def test_profile_splits_slow_steps_by_selector_stage():
    from sfibench.engine.method import MethodSpec
    from sfibench.runners.profile import profile_steps

    spec = MethodSpec("sfi", "reference", SFIConfig(trigger=TriggerConfig(policy="fixed", interval=2, min_gap=1)))
    result = profile_steps(Session.open("tiny-llama", "cpu", "float32"), spec, 3000, 4)
    assert "slow" in result["step_kinds"]
    parts = result["by_kind"]["slow"]["ms_per_step"]
    for stage in ("evidence logits", "power-mean pooling", "prior + fusion", "soft-NMS", "top-K"):
        assert parts[f"selector: {stage}"] > 0, stage


def test_dense_kernel_verdict_compares_with_the_fastest_sdpa_backend_that_ran():
    from sfibench.reporting.throughput_report import dense_kernel_verdicts

    rows = [
        {"batch": 1, "context": 8192, "kernel": "triton split-K", "ran": True, "gb_s": 1500.0},
        {"batch": 1, "context": 8192, "kernel": "sdpa flash", "ran": True, "gb_s": 1100.0},
        {"batch": 1, "context": 8192, "kernel": "sdpa cudnn", "ran": True, "gb_s": 1510.0},
        {"batch": 1, "context": 8192, "kernel": "sdpa efficient", "ran": False, "error": "no GQA"},
        {"batch": 1, "context": 8192, "kernel": "sdpa efficient, K/V expanded", "ran": True, "gb_s": 9999.0},
        {"batch": 8, "context": 8192, "kernel": "triton split-K", "ran": True, "gb_s": 3400.0},
        {"batch": 8, "context": 8192, "kernel": "sdpa flash", "ran": True, "gb_s": 3300.0},
    ]
    verdicts = dense_kernel_verdicts(rows)
    assert [(b, c, ours["gb_s"], best["kernel"]) for b, c, ours, best in verdicts] == [
        (1, 8192, 1500.0, "sdpa cudnn"), (8, 8192, 3400.0, "sdpa flash")]


def test_profile_labels_exist_only_while_a_profiler_records():
    from torch.profiler import profile

    from sfibench.core.labels import label

    with label("sfibench.test") as entered:
        assert entered is None  # no profiler: the shared no-op context
    with profile() as prof:
        with label("sfibench.test"):
            torch.ones(4).sum()
    assert any(event.key == "sfibench.test" for event in prof.key_averages())


def test_the_selector_ablation_reaches_sfi_and_the_report(tmp_path):
    """`--no-nms --keep-neighbours 7` times the best quality ablation's Selector; the report labels it."""
    result = CliRunner().invoke(app, ["throughput", "--model", "tiny-qwen3", "--ctx", "600", "--methods", "sfi",
                                      "--steps", "20", "--repeats", "1", "--no-nms", "--keep-neighbours", "7",
                                      "--trigger", "fixed", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["sfi"]["selector"]["use_nms"] is False
    assert saved["config"]["sfi"]["selector"]["keep_neighbours"] == 7
    assert "ablation beyond the paper" in (tmp_path / "run" / "report.md").read_text()
    even = CliRunner().invoke(app, ["throughput", "--keep-neighbours", "4", "--out", str(tmp_path / "bad")])
    assert even.exit_code != 0 and "odd" in even.output and not (tmp_path / "bad").exists()


def test_bridge_steps_are_timed_as_their_own_kind(tmp_path):
    """`--bridge-steps 3`: the first 3 steps of each pass read the whole history and are filed as `bridge`,
    not as fast steps (whose reads they would inflate); the report says so."""
    result = CliRunner().invoke(app, ["throughput", "--model", "tiny-llama", "--ctx", "600", "--methods", "sfi",
                                      "--k-head", "64", "--n-recent", "32", "--steps", "10", "--repeats", "2",
                                      "--bridge-steps", "3", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    row = json.loads((tmp_path / "run" / "results.json").read_text())["results"]["rows"][0]
    assert row["ms_per_step"]["bridge"]["n"] == 3 * 2  # 3 per timed pass
    reads = row["tokens_read_by_kind"]
    assert reads["bridge"] >= 600 > 4 * reads["fast"]  # dense against sinks + selection + recent window
    assert "SFI bridge steps" in (tmp_path / "run" / "report.md").read_text()
