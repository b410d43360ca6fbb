"""Needle retrieval tasks: classic passkey and RULER's needle-in-a-haystack family.

- passkey: a 5-digit pass key in the classic repetitive noise.
- niah_single: one "special magic number" for one key, hidden in essay prose.
- niah_single_word: the same with a common noun as the value (RULER's "words" needle type): one
  retrieval instead of copying seven digits, each of which needs attention on the next needle token.
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

TOKENS_PER_NUMBER = 10  # a 7-digit number with its separator and the end token, with a little room
TOKENS_PER_WORD = 6
VALUE_WORDS = ("acorn", "anchor", "badger", "banjo", "beacon", "bucket", "cactus", "canoe", "chisel", "cobalt",
               "compass", "dolphin", "emerald", "falcon", "feather", "glacier", "hammock", "harpoon", "igloo",
               "jasmine", "kettle", "lantern", "lobster", "magnet", "marble", "nutmeg", "oyster", "parrot",
               "pebble", "quartz", "raccoon", "saddle", "sapphire", "thimble", "tulip", "umbrella", "velvet",
               "walrus", "whistle", "zebra")


def niah_intro(kind: str = "number") -> str:
    return (f"Some special magic {kind}s are hidden within the following text. Make sure to memorize it. "
            f"I will quiz you about the {kind}s afterwards.")


def niah_needle(key: str, value: str, kind: str = "number") -> str:
    return f"One of the special magic {kind}s for {key} is: {value}."


def niah_question(keys: list[str], plural: bool, kind: str = "number") -> tuple[str, str]:
    """(question, answer prefix) asking for the value(s) of `keys`."""
    joined = ", ".join(keys)
    if plural:
        return (f"What are all the special magic {kind}s for {joined} mentioned in the provided text?",
                f"The special magic {kind}s for {joined} mentioned in the provided text are")
    return (f"What is the special magic {kind} for {joined} mentioned in the provided text?",
            f"The special magic {kind} for {joined} mentioned in the provided text is")


def needle_depths(rng: random.Random, index: int, count: int) -> list[float]:
    return [depth_for(index, DEFAULT_DEPTHS)] + [round(rng.uniform(0.05, 0.95), 3) for _ in range(count - 1)]


def haystack_prompt(fmt: PromptFormat, target: int, haystack: Haystack, needles: list[tuple[float, str]],
                    question: str, prefix: str, task: str, intro: str | None = None) -> tuple[list[int], int]:
    """Fit the essay filler so intro + haystack + question + prefix lands just below `target` tokens."""
    intro = intro or niah_intro()

    def render(n: int) -> list[int]:
        return fmt.first_turn(f"{intro}\n{haystack.render(n, needles)}\n{question}", prefix)

    n, ids = fit_to_tokens(render, target, most=target, what=task)
    return ids, n


def _niah(fmt: PromptFormat, target: int, rng: random.Random, index: int, task: str, keys: int,
          values_per_key: int, queried: int, kind: str = "number") -> Sample:
    names = key_words(rng, keys)
    drawn = rng.sample(VALUE_WORDS, keys * values_per_key) if kind == "word" else \
        [magic_number(rng) for _ in range(keys * values_per_key)]
    values = {k: drawn[i * values_per_key:(i + 1) * values_per_key] for i, k in enumerate(names)}
    pairs = [(k, v) for k in names for v in values[k]]
    depths = needle_depths(rng, index, len(pairs))
    needles = [(d, niah_needle(k, v, kind)) for d, (k, v) in zip(depths, pairs)]
    asked = names[:queried]  # the first key owns the needle at the controlled depth
    question, prefix = niah_question(asked, plural=values_per_key > 1 or queried > 1, kind=kind)
    ids, _ = haystack_prompt(fmt, target, Haystack(rng), needles, question, prefix, task, niah_intro(kind))
    answers = [v for k in asked for v in values[k]]
    per_value = TOKENS_PER_WORD if kind == "word" else TOKENS_PER_NUMBER
    return Sample(task, index, ids, [answers], max_answer_tokens=per_value * len(answers) + 2,
                  meta={"depth": depths[0], "needles": [{"depth": d, "key": k, "value": v}
                                                         for d, (k, v) in zip(depths, pairs)], "asked": asked})


@register_task("niah_single", "one magic number for one key in essay prose")
def niah_single(fmt, target, rng, index):
    return _niah(fmt, target, rng, index, "niah_single", keys=1, values_per_key=1, queried=1)


@register_task("niah_single_word", "one magic word (a common noun) for one key in essay prose")
def niah_single_word(fmt, target, rng, index):
    return _niah(fmt, target, rng, index, "niah_single_word", keys=1, values_per_key=1, queried=1, kind="word")


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
