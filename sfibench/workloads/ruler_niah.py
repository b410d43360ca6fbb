"""RULER's needle-in-a-haystack tasks, and what every RULER task builder shares (Draft, fit, prompt).

The needle wording, the repeated-noise haystack and the tasks' arguments come from the installed package
(ruler_data.py); keys and values are drawn as RULER draws them (7-digit numbers, adjective-noun words from
wonderwords' lists, UUIDs), needles are shuffled with the run seed, placed at RULER's 40 depths in the
essay (between sentences) or at random lines of the other haystacks, and a question about one value is
worded in the singular as RULER words it.
"""

from __future__ import annotations

import functools
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sfibench.workloads import ruler_data as data
from sfibench.workloads.base import ContextSizeError, PromptFormat

DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's needle depths: 40 evenly spaced percentages
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


@dataclass
class Draft:
    """One sample before sizing: its prompt for n haystack units, its answers and what bounds n."""

    render: Callable[[int], list[int]]
    answers: list[str]
    most: int
    meta: dict = field(default_factory=dict)


def fit(render: Callable[[int], list[int]], budget: int, most: int, task: str,
        start: int = 1) -> tuple[int, list[int]]:
    """Largest n in [1, most] whose prompt has at most `budget` tokens, and that prompt.

    From `start` (the previous sample's n, near this one's) scaled by how far its prompt is from the budget,
    steps of doubling size bracket it, so a huge `most` costs nothing and a good start a few renders;
    bisection then closes the bracket.
    """
    start = min(max(start, 1), most)
    ids = render(start)
    guess = min(max(start * budget // max(len(ids), 1), 1), most)  # prompts grow about in proportion to n
    if guess != start:
        start, ids = guess, render(guess)
    step = 1
    if len(ids) <= budget:
        low, high = start, most
        while low < high:
            trial = min(low + step, high)
            candidate = render(trial)
            if len(candidate) > budget:
                high = trial - 1
                break
            low, ids, step = trial, candidate, 2 * step
    else:
        high = start - 1
        while True:
            if high < 1:
                raise ContextSizeError(f"{task}: the shortest prompt has more than the {budget} tokens this "
                                       "--ctx leaves beside the answer; use a larger --ctx")
            trial = max(high + 1 - step, 1)
            candidate = render(trial)
            if len(candidate) <= budget:
                low, ids = trial, candidate
                break
            high, step = trial - 1, 2 * step
    while low < high:
        middle = (low + high + 1) // 2
        candidate = render(middle)
        if len(candidate) <= budget:
            low, ids = middle, candidate
        else:
            high = middle - 1
    return low, ids


def prompt(fmt: PromptFormat, user: str, prefix: str) -> list[int]:
    """The task text as the user's turn, RULER's answer prefix after it (without chat: RULER's `base`)."""
    return fmt.first_turn(user, prefix) if fmt.chat else fmt.starting(fmt.tokenizer.encode(user + prefix))


def split_sentences(text: str) -> list[str]:
    """Sentences of prose: a break after . ! or ? (and closing quotes) before a capital, digit or quote."""
    out, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        out.append(text[start:end.end()].strip())
        start = end.end()
    return out + ([text[start:].strip()] if text[start:].strip() else [])


def draw(rng: random.Random, kind: str) -> str:
    """A needle key or value of RULER's kind: a 7-digit number, an adjective-noun word, or a UUID."""
    if kind == "numbers":
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))
    if kind == "words":  # uniform over RULER's adjective-noun pairs, without building the 6M-pair list
        return f"{rng.choice(sorted_words('adjectivelist.txt'))}-{rng.choice(sorted_words('nounlist.txt'))}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"RULER has no needle type {kind!r}")


@functools.cache
def sorted_words(*lists: str) -> tuple[str, ...]:
    """The distinct words of wonderwords' lists, sorted (RULER sorts them before drawing)."""
    return tuple(sorted(set().union(*(data.word_list(name) for name in lists))))


def niah(fmt, args, kind, target, rng, seed, index) -> Draft:
    values_n, queried = args["num_needle_v"], args["num_needle_q"]
    keys_n = max(args["num_needle_k"], queried)  # as RULER: at least as many keys as the question asks for
    value_kind, haystack = args["type_needle_v"], args["type_haystack"]
    needle = data.source_string("niah", "needle")
    keys, values, needles = [], [], []
    for _ in range(keys_n):
        keys.append(draw(rng, args["type_needle_k"]))
        values.append([draw(rng, value_kind) for _ in range(values_n)])
        needles += [needle.format(type_needle_v=value_kind, key=keys[-1], value=v) for v in values[-1]]
    random.Random(seed).shuffle(needles)  # RULER shuffles the needles with its run seed
    depths = rng.sample(DEPTHS, len(needles))
    asked = rng.sample(range(keys_n), queried)
    queries = [keys[i] for i in asked]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, prefix, noun = kind["template"], kind["answer_prefix"], value_kind
    if queried * values_n == 1:  # RULER words the question for one value in the singular
        template, prefix = (_singular(t) for t in (template, prefix))
        noun = value_kind[:-1]
    place_seed, distractors, stream = rng.getrandbits(64), [], random.Random(rng.getrandbits(64))

    def context(n: int) -> str:
        if haystack == "essay":
            sentences = split_sentences(" ".join(data.essay_words()[:n]).strip())
            cuts = [0] + sorted(int(len(sentences) * (d / 100)) for d in depths) + [len(sentences)]
            parts = []
            for i in range(1, len(cuts)):
                parts.append(" ".join(sentences[cuts[i - 1]:cuts[i]]))
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            return " ".join(parts)
        n = max(n, len(needles))
        if haystack == "repeat":
            lines = [data.source_string("niah", "haystack")] * n
        else:  # "needle": the haystack is distractor needles with keys and values of their own
            while len(distractors) < n:
                key, value = draw(stream, args["type_needle_k"]), draw(stream, value_kind)
                distractors.append(needle.format(type_needle_v=value_kind, key=key, value=value))
            lines = distractors[:n]
        places = sorted(random.Random(place_seed + n).sample(range(n), len(needles)), reverse=True)
        for at, text in zip(places, needles):
            lines.insert(at, text)
        return "\n".join(lines)

    return Draft(lambda n: prompt(fmt, template.format(type_needle_v=noun, context=context(n), query=query),
                                   prefix.format(type_needle_v=noun, query=query)),
                 [v for i in asked for v in values[i]],
                 len(data.essay_words()) if haystack == "essay" else 4 * target,
                 {"needle_values": [v for vs in values for v in vs],
                  "depths": depths if haystack == "essay" else None})


def _singular(text: str) -> str:
    for plural, singular in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(plural, singular)
    return text


