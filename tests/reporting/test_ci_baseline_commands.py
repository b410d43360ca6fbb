"""The CI baseline's recorded commands (reports/ci/baseline.json, which `sfibench check` reruns as they are
written) use only the options each command lists in its --help: a hidden option is an older spelling kept so
old command lines still run, not one a recorded command should teach."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sfibench.cli import app

MANIFEST = Path(__file__).resolve().parents[2] / "reports" / "ci" / "baseline.json"


def test_every_recorded_command_uses_only_public_options():
    commands = typer.main.get_command(app).commands
    runs = json.loads(MANIFEST.read_text())["runs"]
    assert runs
    for name, recipe in runs.items():
        command, *args = recipe["argv"]
        options = {opt: param for param in commands[command].params if param.param_type_name == "option"
                   for opt in [*param.opts, *param.secondary_opts]}
        given = [arg for arg in args if arg.startswith("--")]
        assert given, name
        for arg in given:
            assert arg in options, f"{name}: {command} has no option {arg}"
            assert not options[arg].hidden, f"{name}: {arg} is a hidden spelling of {command}"
