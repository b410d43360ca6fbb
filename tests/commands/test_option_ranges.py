"""Every numeric option of every command has a checked range before any work: walked from the commands' own
signatures, so an option added later is covered without this file naming it. A value outside the range (a
seed beyond 64 bits or below 0, a count no run can take, a NaN or an infinity) is one line naming the option,
exit 2, and nothing is created."""

from __future__ import annotations

import inspect
import typing

import pytest
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.commands.numeric_options import LARGEST_COUNT, SEEDS


def numeric_options() -> list[tuple[str, str, type, object]]:
    """(command, option, int or float, the typer OptionInfo) for every numeric option of every command."""
    found = []
    for info in app.registered_commands:
        command = info.callback
        hints = typing.get_type_hints(command)
        for name, parameter in inspect.signature(command).parameters.items():
            if hints.get(name) in (int, float):
                declared = [d for d in parameter.default.param_decls or () if d.startswith("--")]
                found.append((command.__name__, declared[0] if declared else "--" + name.replace("_", "-"),
                              hints[name], parameter.default))
    return found


def bad_values(kind: type, option: str, info) -> list[str]:
    if kind is float:
        values = ["nan", "inf", "-inf"]
    else:
        values = [str(2**64), str(-(2**64)), str(LARGEST_COUNT + 1 if option != "--seed" else SEEDS[1] + 1)]
    if option == "--seed":
        values.append("-1")
    if info.min is not None:
        values.append(str(info.min - 1))
    if info.max is not None:
        values.append(str(info.max + 1))
    return values


OPTIONS = numeric_options()


def test_the_walk_finds_the_numeric_options():
    names = {(command, option) for command, option, _, _ in OPTIONS}
    assert {("generate", "--seed"), ("quality", "--seed"), ("stability", "--seed"), ("throughput", "--steps"),
            ("stability", "--mass"), ("profile", "--batch")} <= names, names


@pytest.mark.parametrize("command, option, kind, info", OPTIONS, ids=[f"{c} {o}" for c, o, _, _ in OPTIONS])
def test_every_numeric_option_refuses_a_value_out_of_range_before_any_work(tmp_path, monkeypatch, command, option,
                                                                           kind, info):
    monkeypatch.chdir(tmp_path)  # a command that writes by default would write here
    for value in bad_values(kind, option, info):
        result = CliRunner().invoke(app, [command, f"{option}={value}"])
        text = " ".join(result.output.split())
        assert result.exit_code == 2, (value, result.output)
        assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception,
                                                                                            SystemExit), value
        assert option in text, (value, text)
        assert list(tmp_path.iterdir()) == [], value


@pytest.mark.parametrize("command", ["generate", "quality", "stability"])
def test_the_largest_seed_passes_the_range_check(command, monkeypatch):
    """The top of the seed range is accepted by the check (a bad model name stops the command after it)."""
    result = CliRunner().invoke(app, [command, "--seed", str(SEEDS[1]), "--model", "no-such-model"])
    assert result.exit_code == 2 and "--seed" not in result.output and "no-such-model" in result.output, result.output


def test_the_largest_seed_reaches_torch_without_overflow():
    """What the range promises: torch's generators take every seed in it, with room for an offset."""
    import torch

    torch.Generator().manual_seed(SEEDS[1] + 1000)
    with pytest.raises((RuntimeError, ValueError, OverflowError)):  # beyond: the traceback the range prevents
        torch.Generator().manual_seed(2**64)
