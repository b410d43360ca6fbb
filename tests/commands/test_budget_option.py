"""`--budget` is the one budget option of every measuring command, parsed by core/budget.Budget, and what a
run records of it."""

from __future__ import annotations

import json

import typer.main
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.sfi.config import SFIConfig

TINY = ["--model", "tiny-llama", "--device", "cpu"]


def _options(command: str) -> dict:
    return {param.name: param for param in typer.main.get_command(app).commands[command].params}


def test_every_measuring_command_spells_its_budget_one_way():
    for command in ("generate", "profile", "throughput", "quality"):
        assert _options(command)["budget"].opts == ["--budget"], command
    # quality's earlier spelling stays for committed scripts, out of the help
    assert _options("quality")["retention"].hidden


def test_throughput_budget_sets_every_method_and_sfi_by_its_rule(tmp_path):
    result = CliRunner().invoke(app, ["throughput", *TINY, "--ctx", "600", "--steps", "4", "--repeats", "1",
                                      "--methods", "sfi,streaming_llm", "--budget", "200",
                                      "--no-dense-kernels", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "results.json").read_text())["config"]
    expected = SFIConfig().with_budget(200)  # a quarter in whole pages as the window, the rest selected
    assert config["budget"] == 200
    assert (config["sfi"]["k_head"], config["sfi"]["n_recent"]) == (expected.k_head, expected.n_recent)
    report = " ".join((tmp_path / "run" / "report.md").read_text().split())
    assert "every method reads 200 tokens per layer and KV head (--budget)" in report


def test_throughput_refuses_a_budget_beyond_a_context_before_loading():
    result = CliRunner().invoke(app, ["throughput", *TINY, "--ctx", "600", "--budget", "700"])
    assert result.exit_code == 2
    assert "--budget of 700 tokens is larger than the 600-token context" in result.output


def test_profile_records_the_budget_as_given(tmp_path):
    result = CliRunner().invoke(app, ["profile", *TINY, "--ctx", "600", "--steps", "2", "--budget", "20%",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "results.json").read_text())["config"]["budget"] == "20%"
