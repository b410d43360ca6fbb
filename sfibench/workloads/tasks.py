"""The offline tasks by name: every built-in task module, and the samples of a task.

Each task module registers its generator with `base.register_task` when imported and imports nothing
but base.py and the shared text builders; importing them here, once, fills the table `get_task` reads.
"""

from __future__ import annotations

import random

from sfibench.workloads import (  # noqa: F401  (they register)
    multiturn,
    needle_list,
    needles,
    perplexity,
    reasoning,
    variables,
    words,
)
from sfibench.workloads.base import TASKS, PromptFormat, Sample, TaskSpec, UnknownTaskError


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))} "
                               "(LongBench tasks come from --longbench PATH)")
    return TASKS[name]


def task_names() -> str:
    """The built-in tasks, comma-separated in registration order (what `--tasks` accepts)."""
    return ", ".join(TASKS)


def make_samples(task: str, fmt: PromptFormat, target: int, count: int, seed: int) -> list[Sample]:
    """`count` samples of `task`, each seeded by (seed, task, target, index) so any one can be rebuilt."""
    spec = get_task(task)
    return [spec.generate(fmt, target, random.Random(f"{seed}/{task}/{target}/{i}"), i) for i in range(count)]
