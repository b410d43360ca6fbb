"""Needle retrieval tasks: classic passkey and RULER's needle-in-a-haystack family.

- passkey: a 5-digit pass key in the classic repetitive noise.
- niah_single: one "special magic number" for one key, hidden in essay prose.
- niah_multikey: the queried needle among three distractor needles with other keys.
- niah_multivalue: four numbers for the same key; all four must be returned.
- niah_multiquery: four needles with different keys; two of them are asked for in one question.

The first needle of every sample sits at the controlled depth (`DEFAULT_DEPTHS`, cycled by sample
index); further needles go to seeded random depths. The wording follows RULER, whose answer prefix
lets a small instruct model answer in a fixed, scorable form.
"""

from __future__ import annotations

import random

from sfibench.workloads.base import PromptFormat, Sample, fit_to_tokens, register_task
from sfibench.workloads.haystack import (
    DEFAULT_DEPTHS,
    Haystack,
    depth_for,
    insert_at_depths,
    key_words,
    magic_number,
    noise,
)

NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the numbers afterwards.")
TOKENS_PER_NUMBER = 10  # a 7-digit number with its separator and the end token, with a little room


def niah_needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def niah_question(keys: list[str], plural: bool) -> tuple[str, str]:
    """(question, answer prefix) asking for the number(s) of `keys`."""
    joined = ", ".join(keys)
    if plural:
        return (f"What are all the special magic numbers for {joined} mentioned in the provided text?",
                f"The special magic numbers for {joined} mentioned in the provided text are")
    return (f"What is the special magic number for {joined} mentioned in the provided text?",
            f"The special magic number for {joined} mentioned in the provided text is")


def needle_depths(rng: random.Random, index: int, count: int) -> list[float]:
    return [depth_for(index, DEFAULT_DEPTHS)] + [round(rng.uniform(0.05, 0.95), 3) for _ in range(count - 1)]


def haystack_prompt(fmt: PromptFormat, target: int, haystack: Haystack, needles: list[tuple[float, str]],
                    question: str, prefix: str, task: str, intro: str = NIAH_INTRO) -> tuple[list[int], int]:
    """Fit the essay filler so intro + haystack + question + prefix lands just below `target` tokens."""
    def render(n: int) -> list[int]:
        return fmt.first_turn(f"{intro}\n{haystack.render(n, needles)}\n{question}", prefix)

    n, ids = fit_to_tokens(render, target, most=target, what=task)
    return ids, n


def _niah(fmt: PromptFormat, target: int, rng: random.Random, index: int, task: str, keys: int,
          values_per_key: int, queried: int) -> Sample:
    names = key_words(rng, keys)
    values = {k: [magic_number(rng) for _ in range(values_per_key)] for k in names}
    pairs = [(k, v) for k in names for v in values[k]]
    depths = needle_depths(rng, index, len(pairs))
    needles = [(d, niah_needle(k, v)) for d, (k, v) in zip(depths, pairs)]
    asked = names[:queried]  # the first key owns the needle at the controlled depth
    question, prefix = niah_question(asked, plural=values_per_key > 1 or queried > 1)
    ids, _ = haystack_prompt(fmt, target, Haystack(rng), needles, question, prefix, task)
    answers = [v for k in asked for v in values[k]]
    return Sample(task, index, ids, [answers], max_answer_tokens=TOKENS_PER_NUMBER * len(answers) + 2,
                  meta={"depth": depths[0], "needles": [{"depth": d, "key": k, "value": v}
                                                         for d, (k, v) in zip(depths, pairs)], "asked": asked})


@register_task("niah_single", "one magic number for one key in essay prose")
def niah_single(fmt, target, rng, index):
    return _niah(fmt, target, rng, index, "niah_single", keys=1, values_per_key=1, queried=1)


@register_task("niah_multikey", "the queried key's number among 3 distractor needles")
def niah_multikey(fmt, target, rng, index):
    return _niah(fmt, target, rng, index, "niah_multikey", keys=4, values_per_key=1, queried=1)


@register_task("niah_multivalue", "all 4 numbers of one key")
def niah_multivalue(fmt, target, rng, index):
    return _niah(fmt, target, rng, index, "niah_multivalue", keys=1, values_per_key=4, queried=1)


@register_task("niah_multiquery", "the numbers of 2 of 4 keys, asked in one question")
def niah_multiquery(fmt, target, rng, index):
    return _niah(fmt, target, rng, index, "niah_multiquery", keys=4, values_per_key=1, queried=2)


@register_task("passkey", "classic 5-digit pass key in repetitive noise")
def passkey(fmt, target, rng, index):
    key = magic_number(rng, digits=5)
    depth = depth_for(index, DEFAULT_DEPTHS)
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    intro = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
             "I will quiz you about the important information there.")

    def render(n: int) -> list[int]:
        body = insert_at_depths(noise(n), [(depth, needle)])
        return fmt.first_turn(f"{intro}\n{body}\nWhat is the pass key?", "The pass key is")

    _, ids = fit_to_tokens(render, target, most=target // 4 + 8, what="passkey")
    return Sample("passkey", index, ids, [[key]], max_answer_tokens=10, meta={"depth": depth, "passkey": key})
