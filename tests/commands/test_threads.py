"""`--threads N`: every command that computes takes it, states its default, runs on N torch threads and
records the count it ran on."""

from __future__ import annotations

import json

import pytest
import torch
import typer.main
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.device import idle_cores_only, torch_threads

COMPUTING = ("throughput", "profile", "stability", "quality", "generate")
TINY = ["--model", "tiny-llama", "--device", "cpu", "--threads", "1"]


def test_every_computing_command_takes_threads_and_states_its_default():
    commands = typer.main.get_command(app).commands
    for name in COMPUTING:
        option = next((p for p in commands[name].params if p.name == "threads"), None)
        assert option is not None, f"{name} has no --threads"
        assert option.default is None and "default: torch's own count" in option.help, name
    # only the commands that time steps lower the default to the idle cores
    timed = {name for name in COMPUTING
             if "idle" in next(p for p in commands[name].params if p.name == "threads").help}
    assert timed == {"throughput", "profile", "generate"}


def test_a_given_count_holds_inside_and_is_restored_after():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    # given: taken as it is, even above the idle cores
    with idle_cores_only(torch.device("cpu"), threads=before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with torch_threads(None):  # not given: torch's own count
        assert torch.get_num_threads() == before


def test_zero_threads_is_refused():
    result = CliRunner().invoke(app, ["profile", "--model", "tiny-llama", "--device", "cpu",
                                      "--threads", "0"])
    assert result.exit_code == 2


@pytest.mark.parametrize("argv, recorded", [
    (["profile", *TINY, "--ctx", "300", "--steps", "2"], lambda doc: doc["results"]["threads"]),
    (["throughput", *TINY, "--ctx", "300", "--steps", "4", "--repeats", "1", "--methods", "full_kv",
      "--no-dense-kernels"], lambda doc: doc["results"]["threads"]),
    (["stability", *TINY, "--steps", "8", "--prefix", "300"],
     lambda doc: doc["results"]["timing"]["threads"]),
    (["quality", *TINY, "--methods", "sfi", "--tasks", "niah_single", "--ctx", "600", "--budget", "0.5",
      "--samples", "1", "--no-chat"], lambda doc: doc["config"]["threads"]),
], ids=lambda value: value[0] if isinstance(value, list) else "")
def test_a_run_records_the_count_it_ran_on(tmp_path, argv, recorded):
    result = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / "run" / "results.json").read_text())
    assert recorded(document) == 1
    # stability writes after its threads are restored; every other run while they hold
    assert document["provenance"]["torch_threads"] == 1 or argv[0] == "stability"


def test_generate_reports_the_count_it_ran_on():
    result = CliRunner().invoke(app, ["generate", *TINY, "--prompt", "one two three four five six seven",
                                      "--max-new-tokens", "2", "--json", "--method", "full_kv"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["threads"] == 1
