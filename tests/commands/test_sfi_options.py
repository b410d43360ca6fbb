"""SFI's settings are one set of flags: each command that takes one takes the shared declaration
(commands/sfi_options.py), no flag means two things across commands, and a given flag reaches SFI's config."""

from __future__ import annotations

import pytest
import typer.main

from sfibench.cli import app
from sfibench.commands.sfi_options import SETTINGS, VARIANT, SFISettings
from sfibench.core.errors import UsageError
from sfibench.sfi.config import SFIConfig

SFI_COMMANDS = ("generate", "profile", "throughput", "quality", "stability")


def _options(command: str) -> dict:
    return {param.name: param for param in typer.main.get_command(app).commands[command].params}


def _help_without_default(text: str) -> str:
    return text.rsplit(" (default ", 1)[0]


@pytest.mark.parametrize("command", SFI_COMMANDS)
def test_every_sfi_flag_is_the_shared_declaration(command):
    options = _options(command)
    taken = [name for name in options if name in SETTINGS]
    assert taken, f"{command} takes no SFI setting"
    for name in taken:
        shared = SETTINGS[name].option()
        shown = _help_without_default(options[name].help)
        assert shown == _help_without_default(shared.help), (command, name)
        flag = shared.param_decls[0] if shared.param_decls else "--" + name.replace("_", "-")
        assert options[name].opts == [flag], (command, name)


def test_a_flag_means_one_thing_in_every_command():
    seen: dict[str, tuple[str, str]] = {}
    for command in (*SFI_COMMANDS, "env", "models", "report", "check"):
        for param in typer.main.get_command(app).commands[command].params:
            for flag in param.opts:
                meaning = _help_without_default(param.help or "")
                if flag in seen and flag in {f for s in SETTINGS.values() for f in [s.flag or "--" + s.name]}:
                    assert seen[flag][1] == meaning, f"{flag}: {seen[flag][0]} and {command} differ"
                seen.setdefault(flag, (command, meaning))
    # stability's comparison of refresh triggers is spelled apart from SFI's --trigger
    assert "trigger" not in _options("stability") and "fixed_refresh" in _options("stability")


def test_each_command_states_sfi_defaults_and_its_own():
    assert _options("generate")["n_recent"].help.endswith(f"(default {SFIConfig.n_recent})")
    assert _options("throughput")["k_head"].help.endswith(f"(default {SFIConfig.k_head})")
    assert _options("stability")["k_head"].help.endswith("(default 10%)")


def test_given_settings_reach_the_fields_they_name():
    given = SFISettings((("no_nms", True), ("trigger", "fixed"), ("lambda_", 0.3), ("n_sink", 0),
                         ("k_head", "5%")))
    config = given.config()
    assert config.selector.use_nms is False and config.trigger.policy == "fixed"
    assert config.selector.lambda_fixed == 0.3 and config.n_sink == 0
    assert config.k_head == SFIConfig.k_head  # a budget, resolved where the context is known
    assert given.k_head().percent == 5
    assert SFISettings().config() == SFIConfig()
    variant = SFISettings((("no_prior", True), ("w_prefill", 8))).variant()
    assert variant == {"use_prior": False, "w_prefill": 8}
    assert set(VARIANT) <= set(SETTINGS)


@pytest.mark.parametrize("given, message", [
    ((("trigger", "often"),), "--trigger 'often' is not one of"),
    ((("keep_neighbours", 4),), "--keep-neighbours 4 is even"),
    ((("publish", "when_ready"),), "only the optimized path has"),
    ((("k_head", "0.1"),), "0.1 is written 10%"),
])
def test_bad_settings_are_refused_by_name(given, message):
    with pytest.raises(UsageError, match=message):
        SFISettings(given).check("reference")


def test_publish_rule_applies_to_sfi_alone():
    SFISettings((("publish", "when_ready"),)).check(None)  # another method runs: SFI's path rule is moot
