"""niah_list: a long answer that lists many needle values, one sentence per value, in a stated order.

N needles "The special magic number for <key> is <7-digit number>." sit at evenly spread depths of the
essay haystack; the question names the N keys in a seeded order that is not the order they appear in,
and asks for one sentence per key in that order. Each sentence of the answer needs a different needle,
so a method whose selection is fixed at the prompt must have kept all N, while one that refreshes its
selection at sentence boundaries (SFI's slow steps fire at the first token of each new sentence) can
follow the answer through the context.

Registered as niah_list (16 values), niah_list_32 and niah_list_64 (64 values make an answer of more
than 1,024 tokens in most tokenizers: the long-generation fidelity workload). The answer prefix writes
the start of the first sentence, so base models (no chat template) answer in the same form. Scored by
`ordered_list` (metrics/quality.py): the share of the values recalled in the requested order, and
exact match of the whole list.
"""

from __future__ import annotations

import math

from sfibench.workloads.base import PromptFormat, Sample, register_task
from sfibench.workloads.haystack import Haystack, key_words, magic_number
from sfibench.workloads.needles import haystack_prompt

DEFAULT_VALUES = 16
CAP_MARGIN = 1.5  # the answer cap: this many times the tokens of the longest plausible list, plus a few
CAP_EXTRA = 16
# The key a cap is sized with: two 10-letter words, the longest keys `key_words` draws (its words have 4-10
# letters), so the cap does not depend on the seed and a batch's samples share it.
CAP_KEY = "earthquake-strawberry"
INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
         "I will quiz you about the numbers afterwards.")


def list_needle(key: str, value: str) -> str:
    return f"The special magic number for {key} is {value}."


def list_question(keys: list[str]) -> tuple[str, str]:
    """(question, answer prefix): the keys in the order the answer must follow."""
    question = (f"What are the special magic numbers for the following {len(keys)} keys mentioned in the provided "
                f"text? Answer with one sentence per key, in exactly this order: {', '.join(keys)}. Write each "
                "sentence as \"The special magic number for <key> is <number>.\" and nothing else.")
    return question, f"The special magic number for {keys[0]} is"


def answer_cap(fmt: PromptFormat, values: int) -> int:
    """Most tokens the answer may take: every sentence at its longest in the model's tokens, with margin."""
    sentence = fmt.count(" " + list_needle(CAP_KEY, "9999999"))
    return math.ceil(CAP_MARGIN * values * sentence) + CAP_EXTRA


def spread_depths(count: int) -> list[float]:
    """`count` depths evenly spread over [0.05, 0.95] (the middle of equal slices), in insertion order."""
    return [round(0.05 + 0.9 * (i + 0.5) / count, 4) for i in range(count)]


def asked_order(rng, count: int) -> list[int]:
    """A seeded permutation of range(count) that is not the identity (the insertion order), for count > 1."""
    order = list(range(count))
    while count > 1 and order == sorted(order):
        rng.shuffle(order)
    return order


def needle_list(fmt: PromptFormat, target: int, rng, index: int, values: int, task: str) -> Sample:
    keys = key_words(rng, values)
    numbers = [magic_number(rng) for _ in keys]
    while len(set(numbers)) < values:  # distinct values, so each can be credited to one place only
        numbers = [magic_number(rng) for _ in keys]
    depths = spread_depths(values)
    needles = [(d, list_needle(k, v)) for d, k, v in zip(depths, keys, numbers)]
    order = asked_order(rng, values)
    asked = [keys[i] for i in order]
    question, prefix = list_question(asked)
    ids, _ = haystack_prompt(fmt, target, Haystack(rng), needles, question, prefix, task, intro=INTRO)
    return Sample(task, index, ids, [[numbers[i] for i in order]], max_answer_tokens=answer_cap(fmt, values),
                  scorer="ordered_list",
                  meta={"asked": asked, "answer_prefix": prefix,
                        "needles": [{"depth": d, "key": k, "value": v} for d, k, v in zip(depths, keys, numbers)]})


def _register(name: str, values: int) -> None:
    @register_task(name, f"the numbers of {values} keys listed one sentence each, in a stated order (long answer)")
    def generate(fmt, target, rng, index):
        return needle_list(fmt, target, rng, index, values, name)


_register("niah_list", DEFAULT_VALUES)
_register("niah_list_32", 32)
_register("niah_list_64", 64)
