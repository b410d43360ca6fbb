"""Profiler labels for `sfibench profile` that cost nothing unless a profiler is recording.

torch.profiler.record_function enters the dispatcher on every use, profiler or not: about 6 us on
this project's CPU. The decoder marks several regions per layer, which adds up to ~1 ms per eager
decode step of a 30-layer model. `label` checks whether a profiler is on first (~0.3 us).
"""

from __future__ import annotations

import contextlib

import torch
from torch.profiler import record_function

_UNLABELLED = contextlib.nullcontext()  # reusable: entering it does nothing


def label(name: str):
    """`with label("sfibench.mlp"):` names a region in torch.profiler's events; a no-op otherwise."""
    return record_function(name) if torch.autograd._profiler_enabled() else _UNLABELLED
