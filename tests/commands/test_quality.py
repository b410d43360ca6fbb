"""Quality metrics, the scripted decoder, the budget rule, an end-to-end run on tiny-llama, and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.budget import BudgetError
from sfibench.core.errors import UsageError
from sfibench.engine.session import Session
from sfibench.engine.turns import Script, run_scripts
from sfibench.metrics import longbench, quality
from sfibench.registry import create_method
from sfibench.runners.quality import run_quality
from sfibench.runners.quality_batch import conditions, make_condition
from sfibench.commands.quality_options import _preset_retentions, parse_context, parse_retentions, quality_run
from sfibench.sfi.config import SFIConfig, preset_retention


def test_string_match_accepts_the_answer_and_rejects_near_misses():
    assert quality.string_match_all(" 4992383.<|im_end|>", ["4992383"]) == 1.0
    for miss in (" 499238.", " 49923833.", " 4992384.", " 4 992 383", "x4992383"):
        assert quality.string_match_all(miss, ["4992383"]) == 0.0, miss
    assert quality.string_match_all("1111111, 2222222 and 3333333", ["1111111", "3333333", "4444444"]) == \
        pytest.approx(2 / 3)
    assert quality.string_match_all("they are: QXKRB, hdmza", ["QXKRB", "HDMZA"]) == 1.0
    with pytest.raises(ValueError):
        quality.string_match_all("x", [])


def test_wilson_interval_matches_the_closed_form():
    assert quality.wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert quality.wilson_interval(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-4)
    assert quality.wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    assert quality.wilson_interval(19, 20) == pytest.approx((0.76387, 0.99112), abs=1e-4)
    with pytest.raises(ValueError):
        quality.wilson_interval(3, 2)


def test_mean_ci_uses_wilson_for_binary_and_bootstrap_otherwise():
    binary = quality.mean_ci([1.0] * 8 + [0.0] * 2)
    assert binary["interval"] == "wilson" and binary["mean"] == 0.8
    partial = quality.mean_ci([0.5, 0.25, 1.0, 0.75, 0.0, 0.5])
    assert partial["interval"] == "bootstrap" and partial["low"] <= partial["mean"] <= partial["high"]
    assert partial == quality.mean_ci([0.5, 0.25, 1.0, 0.75, 0.0, 0.5])  # seeded


def test_fidelity_metrics_on_small_tensors():
    full = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    assert quality.kl_per_step(full, full).abs().max() < 1e-6
    other = torch.tensor([[0.0, 2.0, -1.0], [0.0, 1.0, 0.0]])
    p, q = full[0].softmax(-1), other[0].softmax(-1)
    assert quality.kl_per_step(full, other)[0] == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-5)
    assert quality.top1_agreement(full, other) == 0.5
    nll = quality.negative_log_likelihood(full, torch.tensor([0, 1]))
    assert nll[0] == pytest.approx(-math.log(float(full[0].softmax(-1)[0])), rel=1e-5)
    assert quality.token_agreement([1, 2, 3, 4], [1, 2, 9]) == 0.5


def test_longbench_metrics():
    assert longbench.qa_f1("The Eiffel Tower.", "eiffel tower") == 1.0
    assert longbench.qa_f1("Paris, France", "Paris") == pytest.approx(2 / 3)
    assert longbench.rouge("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(5 / 6)
    assert longbench.classification("This is sports news.", "sports", all_classes=["sports", "news", "tech"]) == 0.5
    assert longbench.retrieval("Paragraph 3, maybe Paragraph 7", "Paragraph 3") == 0.5
    assert longbench.count("There are 12 unique paragraphs.", 12) == 1.0
    assert longbench.code_sim("# comment\nx = foo(1)\n", "x = foo(1)") == 1.0
    assert longbench.qa_f1_zh("北京。", "北京") == 1.0
    assert longbench.score("triviaqa", "\nAda Lovelace\nQuestion: next", ["Ada Lovelace", "Ada"]) == 1.0
    assert quality.score_answer("longbench:passage_count", "7", ["7"]) == 1.0


@pytest.fixture(scope="module")
def tiny():
    return Session.open("tiny-llama", "cpu")


def _run(session, spec_name, prompts, scripts, teacher=None, retention=None):
    prefilled = session.prefill(prompts, 64)
    condition = make_condition(spec_name, retention, len(prompts[0]))
    method = create_method(condition.spec, session.loaded.config, session.loaded.tokenizer)
    return run_scripts(session.loaded.model, session.cache, method, prefilled, scripts, teacher=teacher,
                       keep_logits=True, pad_id=0)


def test_scripted_turns_force_questions_and_replay_exactly(tiny):
    prompts = [list(b"The lighthouse keeper wrote the number down. " * 6), list(b"Bread rises slowly. " * 9)]
    follow = [list(b"\nAnd now?\n"), list(b"\nAgain:")]
    scripts = [Script(5, [follow[0]], frozenset()), Script(4, [follow[1], follow[1]], frozenset())]
    streams = _run(tiny, "full_kv", prompts, scripts)
    assert [len(s.answers) for s in streams] == [2, 3]
    assert [len(a) for a in streams[1].answers] == [4, 4, 4]
    assert streams[0].tokens == streams[0].answers[0] + follow[0] + streams[0].answers[1]
    assert len(streams[0].answer_logits) == 10
    # Teacher-forcing a method on Full-KV's stream: Full-KV itself reproduces its logits exactly,
    # and a sparse method is compared on the same inputs.
    replay = _run(tiny, "full_kv", prompts, scripts, teacher=streams)
    assert replay[0].tokens == streams[0].tokens
    assert torch.equal(torch.stack(replay[0].answer_logits), torch.stack(streams[0].answer_logits))
    sparse = _run(tiny, "streaming_llm", prompts, scripts, teacher=streams, retention=0.5)
    assert sparse[1].tokens == streams[1].tokens and len(sparse[1].answer_logits) == 12
    assert all(r < 0.75 for r in sparse[0].retention)


def test_budget_rule():
    recent_for_budget = SFIConfig().recent_for_budget
    assert recent_for_budget(205) == 48 and recent_for_budget(4096) == 256 and recent_for_budget(40) == 16
    sfi = make_condition("sfi", 0.1, 2048).spec.config
    assert (sfi.n_recent, sfi.k_head) == (48, 205 - 4 - 48)
    assert make_condition("streaming_llm", 0.15, 4096).spec.config.budget == 614
    assert make_condition("snapkv", 0.5, 2048).spec.config.budget == 1024
    with pytest.raises(BudgetError, match="50 tokens: .*SnapKV.s 64-token observation window.*use a larger --budget or --ctx"):
        make_condition("snapkv", 0.1, 500)
    with pytest.raises(BudgetError, match=r"or a fraction of the context in \(0, 1\]"):
        parse_retentions(["0.2", "1.5"])
    with pytest.raises(BudgetError, match="at least 1 token"):
        parse_retentions(["0"])
    # one share, three spellings; whole tokens are that share of the one context
    assert parse_retentions(["0.15", "15%"]) == [0.15, 0.15]
    assert parse_retentions(["512"], ["2k"]) == [0.25]
    assert parse_context("2k") == 2048 and parse_context("3000") == 3000 and parse_context("max") == "max"


def test_sfi_variant_changes_only_sfi_and_names_bad_settings():
    plan = conditions(["sfi", "snapkv"], [0.2], 2048, {"use_nms": False, "w_prefill": 64, "keep_neighbours": 5,
                                                       "evidence_norm": "visible", "bridge_steps": 3,
                                                       "publish": "when_ready", "policy": "bootstrap"})
    sfi = next(c for c in plan if c.method == "sfi").spec.config
    assert sfi.selector.use_nms is False and sfi.w_prefill == 64 and sfi.selector.use_prior is True
    assert (sfi.selector.keep_neighbours, sfi.selector.evidence_norm) == (5, "visible")
    assert (sfi.bridge_steps, sfi.publish) == (3, "when_ready")
    assert (sfi.trigger.policy, sfi.trigger.t_max) == ("bootstrap", 96)  # the refresh off, the rest as it was
    assert make_condition("sfi", 0.2, 2048).spec.config.selector.use_nms is True  # defaults untouched
    with pytest.raises(ValueError, match="unknown SFI setting 'use_magic'"):
        make_condition("sfi", 0.2, 2048, variant={"use_magic": True})


@pytest.mark.parametrize("context", [8192, 10000, 16384, 32768])
@pytest.mark.parametrize(("preset", "k_head"), [("paper-2k", 2048), ("paper-4k", 4096)])
def test_sfi_preset_gives_the_authors_operating_point_and_every_method_its_budget(preset, k_head, context):
    retention = preset_retention(preset, context)
    sfi = make_condition("sfi", retention, context).spec.config
    assert (sfi.n_sink, sfi.k_head, sfi.n_recent) == (4, k_head, 256)
    assert (sfi.trigger.policy, sfi.trigger.t_max, sfi.trigger.min_gap) == ("punctuation_tmax", 96, 16)
    assert make_condition("streaming_llm", retention, context).spec.config.budget == 4 + k_head + 256
    assert make_condition("snapkv", retention, context).spec.config.budget == 4 + k_head + 256


def test_sfi_preset_refuses_a_context_it_would_read_whole():
    with pytest.raises(BudgetError, match="fully dense"):
        preset_retention("paper-4k", 4096)
    with pytest.raises(UsageError, match="unknown --sfi-preset 'paper-8k'"):
        preset_retention("paper-8k", 65536)


def test_sfi_preset_run_records_the_preset_and_its_retention(tmp_path):
    out = tmp_path / "preset"
    result = CliRunner().invoke(app, ["quality", "--model", "tiny-llama", "--methods", "sfi", "--tasks", "niah_single",
                                      "--ctx", "2400", "--sfi-preset", "paper-2k", "--samples", "1", "--no-chat",
                                      "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["sfi_preset"] == "paper-2k" and config["retentions"] == [2308 / 2400]


def test_sfi_presets_share_one_run():
    """paper-2k,paper-4k: both operating points from the same prefills, one retention each."""
    assert _preset_retentions("paper-2k,paper-4k", ["8k"], None) == [2308 / 8192, 4356 / 8192]
    assert list(_preset_retentions(None, ["8k"], None)) == [0.15, 0.5]


def test_end_to_end_on_tiny_llama(tmp_path):
    tiny = ("tiny-llama", ["sfi", "streaming_llm", "snapkv"], ["niah_single", "ppl"], ["600"])
    run_dir = run_quality(quality_run(*tiny, ["0.5"], ["2"], out=tmp_path / "run", device="cpu", chat=False, batch=2))
    results = json.loads((run_dir / "results.json").read_text())
    cells = results["results"]["cells"]
    assert {(c["task"], c["method"]) for c in cells} == {(t, m) for t in ("niah_single", "ppl")
                                                           for m in ("full_kv", "sfi", "streaming_llm", "snapkv")}
    niah = [c for c in cells if c["task"] == "niah_single"]
    assert all(c["n"] == 2 and 0 <= c["ci_low"] <= c["accuracy"] <= c["ci_high"] <= 1 for c in niah)
    full = next(c for c in niah if c["method"] == "full_kv")
    assert full["kl"] == 0 and full["top1_agreement"] == 1 and full["measured_retention"] == 1
    assert all(c["perplexity"] > 1 for c in cells if c["task"] == "ppl")
    assert len(results["samples"]) == 16
    for name in ("report.md", "accuracy_vs_retention.png", "fidelity_vs_retention.png", "perplexity_vs_retention.png"):
        assert (run_dir / name).exists()
    assert "Claim check" in (run_dir / "report.md").read_text()
    # --resume keeps every finished (task, context) and refuses different settings
    again = run_quality(quality_run(*tiny, ["0.5"], ["2"], out=run_dir, device="cpu", chat=False, batch=2,
                                    resume=True))
    resumed = json.loads((again / "results.json").read_text())
    assert resumed["samples"] == results["samples"] and len(resumed["provenance"]["resumed_from"]) == 1
    with pytest.raises(ValueError, match="--resume: .* different retentions"):
        run_quality(quality_run(*tiny, ["0.4"], ["2"], out=run_dir, device="cpu", chat=False, batch=2, resume=True))
    with pytest.raises(ValueError, match="--resume: .* different sfi_variant"):
        run_quality(quality_run(*tiny, ["0.5"], ["2"], out=run_dir, device="cpu", chat=False, batch=2, resume=True,
                                sfi_variant={"use_nms": False}))


def test_ablation_run_records_the_sfi_variant(tmp_path):
    out = tmp_path / "ablation"
    result = CliRunner().invoke(app, ["quality", "--model", "tiny-llama", "--methods", "sfi", "--tasks", "niah_single",
                                      "--ctx", "600", "--retention", "0.5", "--samples", "1", "--no-chat",
                                      "--no-nms", "--w-prefill", "32", "--keep-neighbours", "3", "--evidence-norm",
                                      "visible", "--nms-alpha", "0.5", "--bridge-steps", "2", "--trigger", "bootstrap",
                                      "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["config"]["sfi_variant"] == {"use_nms": False, "w_prefill": 32, "nms_alpha": 0.5,
                                              "evidence_norm": "visible", "keep_neighbours": 3, "bridge_steps": 2,
                                              "policy": "bootstrap"}
    assert saved["config"]["sfi_settings"][0]["trigger"] == "bootstrap"  # what the method ran with
    assert all(record["slow_steps"] == 0 for record in saved["samples"])
    assert "SFI ablation" in (out / "report.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--tasks", "niah_triple"], "unknown task 'niah_triple'"),
    (["--ctx", "9000"], "exceeds tiny-llama's limit of 4096"),
    (["--budget", "0.2,1.5"], "or a fraction of the context in (0, 1]"),
    (["--methods", "sfi,h2o"], "unknown method 'h2o'"),
    (["--longbench", "/nonexistent/longbench"], "does not exist"),
    # SFI ablation settings
    (["--evidence-norm", "all"], "--evidence-norm 'all' is not one of: candidates, visible"),
    (["--keep-neighbours", "4"], "--keep-neighbours 4 is even"),
    (["--keep-neighbours", "0"], "Invalid value for '--keep-neighbours'"),
    (["--nms-radius", "-1"], "Invalid value for '--nms-radius'"),
    (["--nms-alpha", "-0.5"], "Invalid value for '--nms-alpha'"),
    (["--bridge-steps", "-2"], "Invalid value for '--bridge-steps'"),
    (["--trigger", "never"], "--trigger 'never' is not one of: punctuation_tmax, fixed, random, bootstrap"),
    (["--ctx", "8k", "--sfi-preset", "paper-2k,paper-8k"], "unknown --sfi-preset 'paper-8k'"),
])
def test_bad_input_is_one_clear_error(tmp_path, args, message):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["quality", "--model", "tiny-llama", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not out.exists()  # nothing written for a command that could not run


def test_longbench_with_wrong_fields_is_a_clear_error(tmp_path):
    file = tmp_path / "hotpotqa.jsonl"
    file.write_text(json.dumps({"question": "q", "context": "c"}) + "\n")
    result = CliRunner().invoke(app, ["quality", "--model", "tiny-llama", "--tasks", "", "--longbench", str(file),
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "lacks the field" in " ".join(result.output.split())


def test_report_names_sfi_settings_and_what_the_read_retention_is_over(tmp_path):
    """Gemma-3-style model (sliding-window layers): the report names the preset with k_head, recent window
    and budget, and "read" is over the global layers, where the budget applies (Full-KV reads 1 there)."""
    out = tmp_path / "preset"
    result = CliRunner().invoke(app, ["quality", "--model", "tiny-gemma3", "--methods", "sfi", "--tasks", "niah_single",
                                      "--ctx", "2400", "--sfi-preset", "paper-2k", "--samples", "1", "--no-chat",
                                      "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    config, cells = saved["config"], saved["results"]["cells"]
    assert config["attention_layers"] == {"layers": 3, "global": 1, "sliding_window": 16}
    assert [(s["k_head"], s["n_recent"], s["n_sink"], s["budget"]) for s in config["sfi_settings"]] == [(2048, 256, 4, 2308)]
    full = next(c for c in cells if c["method"] == "full_kv")
    sfi = next(c for c in cells if c["method"] == "sfi")
    assert full["measured_retention_global"] == 1.0 and full["measured_retention"] < 0.4  # 2 of 3 layers read 16
    assert 0.9 < sfi["measured_retention_global"] <= 1.0 and sfi["measured_retention"] < 0.4
    report = " ".join((out / "report.md").read_text().split())
    assert "(SFI preset paper-2k)" in report and "| 2400 | 0.961667 | paper-2k | 4 | 2,048 | 256 | 2,308 |" in report
    assert "tokens read per global layer and KV head" in report
    assert "over the 1 global layers" in report and "read, global layers" in report
    assert f"n=1 ({full['measured_retention_global']:.2f})" in report  # the printed figure is the one labelled


def test_report_of_an_older_run_says_its_read_figure_is_over_all_layers():
    """Runs recorded before the global-layer figure: a Full-KV read below 1 shows sliding layers, and the label
    says the figure includes them rather than passing it off as the budget's retention."""
    from sfibench.reporting.quality_summary import read_scope

    cells = [{"method": "full_kv", "measured_retention": 0.22}, {"method": "sfi", "measured_retention": 0.10}]
    scope = read_scope({"retentions": [0.28]}, cells)
    assert scope["key"] == "measured_retention" and scope["short"] == "read, all layers"
    assert "sliding-window layers included" in scope["label"]
    dense = read_scope({"retentions": [0.28]}, [{"method": "full_kv", "measured_retention": 1.0}])
    assert not dense["sliding"] and "every layer is global" in dense["label"]
