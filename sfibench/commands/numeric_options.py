"""The ranges every numeric option of every command shares, checked before the command's body runs.

Typer checks each option's own min/max; what no per-option bound says is checked here for all of them at
once: a float must be finite (typer passes NaN through a bound), a count must stay where torch's index
arithmetic holds, and a seed must be one every generator it reaches accepts. The CLI wraps each command in
`checked_numbers`, so an option added later is covered without naming it.
"""

from __future__ import annotations

import functools
import inspect
import math
import typing

import typer

from sfibench.commands.common import print_error
from sfibench.core.errors import UsageError

SEEDS = (0, 2**63 - 1)  # what every generator a seed reaches accepts (torch's take up to 2**64 - 1)
LARGEST_COUNT = 2**31 - 1  # no count, length or size comes near; beyond, torch's 32-bit index arithmetic wraps


def checked_numbers(command):
    """`command` with every int and float option checked before its body runs: floats finite, ints at most
    LARGEST_COUNT, seeds in SEEDS; typer's own min/max bounds are checked by typer before this. Each refusal
    is one line naming the option, exit 2, as every other bad option."""
    hints = typing.get_type_hints(command)
    numeric = {name: (hints[name], _option_name(name, parameter.default))
               for name, parameter in inspect.signature(command).parameters.items() if hints.get(name) in (int, float)}

    @functools.wraps(command)
    def checked(**values):
        for name, (kind, option) in numeric.items():
            try:
                check_number(values.get(name), kind, option, seed=name == "seed")
            except UsageError as error:
                print_error(error)
                raise typer.Exit(code=2) from None
        return command(**values)

    return checked


def check_number(value, kind, option: str, seed: bool = False) -> None:
    """One numeric option's value (None: left out) against the ranges every such option shares."""
    if value is None:
        return
    if kind is float and not math.isfinite(value):
        raise UsageError(f"{option} {value} is not a finite number; give a number such as 0.5")
    if seed and not SEEDS[0] <= value <= SEEDS[1]:
        raise UsageError(f"{option} {value} is outside 0..{SEEDS[1]} (2**63 - 1); give a whole number in that range")
    if kind is int and not seed and abs(value) > LARGEST_COUNT:
        raise UsageError(f"{option} {value} is larger than any value it can take; give at most {LARGEST_COUNT:,}")


def _option_name(name: str, info) -> str:
    declared = [d for d in getattr(info, "param_decls", None) or () if d.startswith("--")]
    return declared[0] if declared else "--" + name.replace("_", "-")
