"""Each command checks its options into one frozen run config and hands it whole to its runner; `--k-head` is a
Budget wherever it is an option, spelled as whole tokens (128) or a percentage (10%)."""

from __future__ import annotations

import dataclasses

import pytest
from no_model import forbid_model_loading
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.budget import Budget
from sfibench.runners import generate, profile, quality, stability, throughput


class RunSeen(Exception):
    """Stops the command where it hands its run config to the runner, carrying the config out."""


def stop_with_run(run, *args, **kwargs):
    raise RunSeen(run)


RUNNERS = {"throughput": (throughput, "run_throughput"), "quality": (quality, "run_quality"),
           "profile": (profile, "run_profile"), "stability": (stability, "run_stability"),
           "generate": (generate, "run_generate")}
ARGS = {"throughput": ["--ctx", "1k,2k"], "quality": ["--ctx", "1k"], "profile": ["--ctx", "1k"],
        "stability": [], "generate": ["--prompt", "The keeper lit the lamp."]}


def run_config(command: str, args: list[str], monkeypatch):
    forbid_model_loading(monkeypatch)
    module, name = RUNNERS[command]
    monkeypatch.setattr(module, name, stop_with_run)
    result = CliRunner().invoke(app, [command, "--model", "tiny-llama", "--device", "cpu", *args])
    assert isinstance(result.exception, RunSeen), result.output
    return result.exception.args[0]


@pytest.mark.parametrize("command", RUNNERS)
def test_each_command_hands_its_runner_one_frozen_config(command, monkeypatch):
    run = run_config(command, ARGS[command], monkeypatch)
    assert dataclasses.is_dataclass(run)
    field = dataclasses.fields(run)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(run, field, None)
    assert not any(isinstance(getattr(run, f.name), list) for f in dataclasses.fields(run))


@pytest.mark.parametrize("command", ["throughput", "generate", "stability"])
@pytest.mark.parametrize("spelled, budget", [("128", Budget(tokens=128)), ("10%", Budget(percent=10.0))])
def test_k_head_is_a_budget_in_either_spelling(command, spelled, budget, monkeypatch):
    run = run_config(command, [*ARGS[command], "--k-head", spelled], monkeypatch)
    k_head = run.analysis.k_head if command == "stability" else run.k_head
    assert k_head == budget


def test_a_k_head_below_one_token_is_refused_before_the_run(monkeypatch):
    forbid_model_loading(monkeypatch)
    result = CliRunner().invoke(app, ["throughput", "--model", "tiny-llama", "--ctx", "1k", "--k-head", "0.01%"])
    assert result.exit_code == 2 and "less than one token" in result.output
