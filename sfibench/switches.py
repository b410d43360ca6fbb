"""Environment switches for A/B timing runs: one reader, so every switch refuses a bad value the same way.

A switch is read where it is used (per launch or per session), not at import, so one process can time
both settings. A value outside `allowed` is a UsageError naming the variable, the value and each choice.
"""

from __future__ import annotations

import os

from sfibench.core.errors import UsageError


def read_switch(name: str, allowed: dict[str, str], default: str) -> str:
    """The value of environment variable `name` (`default` when unset); `allowed` maps each accepted value
    to what it means, which the error message lists."""
    value = os.environ.get(name, default)
    if value not in allowed:
        choices = "; ".join(f"{key} = {meaning}" for key, meaning in allowed.items())
        raise UsageError(f"{name}={value!r} is not accepted; use one of: {choices} (unset means {default})")
    return value
