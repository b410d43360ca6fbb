"""Every method list the command line shows is the registry's: a help naming a stale set of methods fails.

The commands are read as click builds them from the Typer app, so what is checked is what `--help` prints.
"""

from __future__ import annotations

import re

import pytest
import typer.main

from sfibench import registry
from sfibench.cli import app

# A run of two or more lower-case identifiers joined by commas: how a help text or a default lists methods
_NAME_LIST = re.compile(r"[a-z][a-z0-9_]*(?:\s*,\s*[a-z][a-z0-9_]*)+")
METHOD_OPTIONS = ("method", "methods")


def _commands():
    group = typer.main.get_command(app)
    return group, sorted(group.commands.items())


def _listed_names(text: str) -> set[str]:
    names: set[str] = set()
    for listed in _NAME_LIST.findall(text or ""):
        names.update(name.strip() for name in listed.split(","))
    return names


def _method_options():
    _, commands = _commands()
    return [(name, param) for name, command in commands for param in command.params
            if param.name in METHOD_OPTIONS]


def test_every_method_option_is_found():
    # generate, profile, quality and throughput each choose methods; a renamed option would empty the checks
    assert {name for name, _ in _method_options()} >= {"generate", "profile", "quality", "throughput"}


@pytest.mark.parametrize("command, param", _method_options(), ids=lambda value: getattr(value, "name", value))
def test_method_option_lists_exactly_the_registered_methods(command, param):
    shown = f"{param.help or ''} {param.default if isinstance(param.default, str) else ''}"
    assert _listed_names(shown) == set(registry.names()), f"{command} --{param.name}: {shown!r}"


def test_app_help_lists_exactly_the_registered_methods():
    group, _ = _commands()
    assert _listed_names(group.help) == set(registry.names()), group.help


def test_a_stale_list_is_caught():
    # the check itself: a list missing a registered method, or naming one that is not, does not pass
    stale = ", ".join(registry.names()[:-1] + ["h2o"])
    assert _listed_names(f"methods: {stale}") != set(registry.names())
