"""The command line as a user meets it: exit codes, error messages, and `generate --json`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sfibench.cli import app

runner = CliRunner()


def test_generate_json_reports_tokens_and_per_step_accounting():
    result = runner.invoke(app, ["generate", "--model", "tiny-qwen3", "--method", "sfi", "--prompt",
                                 "The keeper lit the lamp. " * 30, "--max-new-tokens", "12", "--n-recent", "16",
                                 "--k-head", "16", "--page", "4", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["prompt_tokens"] == len(("The keeper lit the lamp. " * 30).encode())
    assert 2 <= len(out["generated_ids"]) <= 12  # a random tiny model may emit its end token early
    assert len(out["steps"]) == len(out["generated_ids"]) - 1  # the first token comes from the prefill
    assert {s["kind"] for s in out["steps"]} <= {"slow", "fast"}
    for step in out["steps"]:
        assert 0 < step["retention"] <= 1
        assert (step["tokens_read_mean"] < step["kv_length"]) == (step["kind"] == "fast")


def test_bad_input_exits_non_zero_with_the_fix():
    cases = [
        (["generate", "--model", "nope", "--prompt", "x"], "valid presets"),
        (["generate", "--model", "tiny-llama", "--method", "h2o", "--prompt", "x"], "valid methods"),
        (["generate", "--model", "tiny-llama", "--prompt", ""], "empty"),
        (["generate", "--model", "tiny-llama", "--prompt", "x", "--prompt-file", "README.md"], "not both"),
        (["generate", "--model", "tiny-llama", "--prompt", "x" * 5000], "limit of 4,096"),
        (["generate", "--model", "tiny-llama", "--prompt", "hello", "--budget", "900"], "larger than"),
        (["generate", "--model", "tiny-llama", "--prompt", "hello", "--path", "fast", "--method", "sfi"],
         "no 'fast' path"),
        (["generate", "--model", "tiny-llama", "--prompt", "x" * 400, "--method", "snapkv", "--budget", "50"],
         "SnapKV's 64-token observation window"),
        (["generate", "--model", "tiny-llama", "--prompt", "x" * 400, "--method", "streaming_llm", "--budget", "3"],
         "no window beside its 4 sinks"),
        (["generate", "--model", "tiny-llama", "--prompt", "x" * 400, "--method", "sfi", "--budget", "2%"],
         "no room for selected tokens"),
        (["generate", "--model", "tiny-llama", "--prompt", "x", "--evidence-norm", "all"], "--evidence-norm 'all'"),
        (["generate", "--model", "tiny-llama", "--prompt", "x", "--keep-neighbours", "4"], "is even"),
        (["quality", "--model", "tiny-llama", "--keep-neighbours", "2"], "is even"),
        (["quality", "--model", "tiny-llama", "--publish", "when_ready"], "only the optimized path"),
        (["generate", "--model", "tiny-llama", "--prompt", "x", "--publish", "later"], "--publish 'later'"),
        (["quality", "--model", "tiny-llama", "--sfi-preset", "paper-2k", "--retention", "0.2"], "not both"),
        (["quality", "--model", "tiny-llama", "--sfi-preset", "paper-2k", "--ctx", "3k,4k"], "exactly one --ctx"),
        (["quality", "--model", "tiny-llama", "--sfi-preset", "paper-2k", "--ctx", "2k"], "fully dense"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


def test_generate_without_a_prompt_continues_the_shipped_essays_sparsely():
    result = runner.invoke(app, ["generate", "--model", "tiny-llama", "--max-new-tokens", "4", "--budget", "15%",
                                 "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["prompt_tokens"] == 2560  # past 2,308 tokens, where SFI at its default k_head stops being dense
    assert all(step["tokens_read_mean"] <= 0.16 * step["kv_length"] for step in out["steps"] if step["kind"] == "fast")


SFI_PROMPT = ["--model", "tiny-qwen3", "--method", "sfi", "--prompt", "The keeper lit the lamp. " * 30,
              "--n-recent", "16", "--k-head", "16", "--page", "4", "--json"]


def test_generate_bridge_steps_read_densely_then_sparsely():
    bridged = runner.invoke(app, ["generate", *SFI_PROMPT, "--max-new-tokens", "8", "--bridge-steps", "3",
                                  "--trigger", "bootstrap"])
    assert bridged.exit_code == 0, bridged.output
    steps = json.loads(bridged.stdout)["steps"]
    assert len(steps) > 3
    assert all(s["tokens_read_mean"] == s["kv_length"] and s["kind"] == "bridge" for s in steps[:3])
    assert all(s["tokens_read_mean"] < s["kv_length"] and s["kind"] == "fast" for s in steps[3:])
    unbridged = runner.invoke(app, ["generate", *SFI_PROMPT, "--max-new-tokens", "2", "--trigger", "bootstrap"])
    first = json.loads(unbridged.stdout)["steps"][0]
    assert first["tokens_read_mean"] < first["kv_length"]


def test_generate_runs_with_every_selector_ablation():
    result = runner.invoke(app, ["generate", *SFI_PROMPT, "--max-new-tokens", "10", "--trigger", "fixed",
                                 "--interval", "3", "--min-gap", "1", "--evidence-norm", "visible",
                                 "--keep-neighbours", "3", "--nms-radius", "4", "--nms-alpha", "0.5"])
    assert result.exit_code == 0, result.output
    steps = json.loads(result.stdout)["steps"]
    assert any(s["kind"] == "slow" for s in steps)  # decode refreshes took the visible-norm evidence too
    assert all(s["tokens_read_mean"] < s["kv_length"] for s in steps if s["kind"] == "fast")
