"""Tasks answered after reasoning, scored on the final answer only.

vt_reason: variable tracking answered after step-by-step reasoning.

Several chains of assignments are hidden in essay prose (`VAR QXKRB = 52817.`, then at later depths
`VAR HDMZA = VAR QXKRB.` and so on), one value per chain. The question names the last variable of one
chain and asks for its value, reasoning first: follow the chain back one assignment per sentence, then
end with a line "Answer: <value>". Each hop of the reasoning needs a different assignment, and the other
chains' values are there to be confused with, so the answer cannot be guessed from the only number in
the text. The reasoning takes a few hundred tokens, over which SFI's refresh fires at sentence starts.

niah_reason: the niah_multikey question over RETRIEVAL_KEYS needles, answered after going through the
text's needles one sentence each (key and number) and saying which one the question asks for. Each
sentence of that reasoning needs a different needle, so a method's selection must move from sentence to
sentence, as SFI's refresh is meant to make it; the final answer needs the asked one among look-alikes.

Both are scored by `final_answer` (metrics/quality.py): the value must be on the line of the last "Answer:";
an answer without that line scores 0, whatever its reasoning names. The answer may take up to
`REASON_TOKENS` (vt_reason) or `NIAH_REASON_TOKENS` (niah_reason) generated tokens and stops earlier at the
model's end-of-turn token.
"""

from __future__ import annotations

import string
from itertools import pairwise

from sfibench.workloads.base import Sample, register_task
from sfibench.workloads.haystack import DEFAULT_DEPTHS, Haystack, depth_for, key_words, magic_number
from sfibench.workloads.needles import haystack_prompt, needle_depths, niah_intro, niah_needle

CHAINS = 3  # one asked, the others distractors with values of their own
HOPS = 4  # assignments after the first in each chain: 5 variables per chain
REASON_TOKENS = 512  # vt_reason's answer cap: reasoning and the final line
# niah_reason: one asked, five look-alikes. Qwen2.5-Coder-1.5B-Instruct's answers over six needles, final line
# included, took 348-447 tokens where it answered (reports/quality-qwen2.5-coder-1.5b-niah-reason-4k-cpu); the
# cap leaves room for a wordier answer
RETRIEVAL_KEYS = 6
NIAH_REASON_TOKENS = 768  # niah_reason's answer cap
INTRO = "Memorize and track the chains of variable assignment hidden in the following text."


def variable_names(rng, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in names:
            names.append(name)
    return names


def reason_question(variable: str) -> str:
    return (f"Question: What is the numeric value of VAR {variable} in the text above? Think step by step before "
            f"answering: start from VAR {variable}, find the assignment that gives it its value, and follow the "
            "chain of assignments back one step per sentence until you reach a number. Then end with a final "
            "line of the form \"Answer: <number>\".")


@register_task("vt_reason", f"variable tracking with reasoning: the value at the end of one of {CHAINS} chains of "
                            f"{HOPS + 1} variables, reasoned step by step (answer cap {REASON_TOKENS} tokens)")
def variable_tracking_reasoned(fmt, target, rng, index):
    names = variable_names(rng, CHAINS * (HOPS + 1))
    chains = [names[c * (HOPS + 1):(c + 1) * (HOPS + 1)] for c in range(CHAINS)]
    values = [magic_number(rng, digits=5) for _ in chains]
    while len(set(values)) < CHAINS:
        values = [magic_number(rng, digits=5) for _ in chains]
    first = depth_for(index, DEFAULT_DEPTHS)  # the asked chain's value: the controlled depth
    needles, hop_depths = [], []
    for c, (chain, value) in enumerate(zip(chains, values)):
        start = first if c == 0 else round(rng.uniform(0.05, 0.9), 3)
        hops = sorted(round(rng.uniform(start, 1.0), 3) for _ in range(HOPS))
        statements = [f"VAR {chain[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in pairwise(chain)]
        needles += list(zip([start, *hops], statements))
        if c == 0:
            hop_depths = hops
    asked = chains[0][-1]
    prefix = "Let me follow the chain of assignments step by step."
    ids, _ = haystack_prompt(fmt, target, Haystack(rng), needles, reason_question(asked), prefix, "vt_reason",
                             intro=INTRO)
    return Sample("vt_reason", index, ids, [[values[0]]], max_answer_tokens=REASON_TOKENS, scorer="final_answer",
                  meta={"depth": first, "hop_depths": hop_depths, "asked": asked, "chain": chains[0],
                        "distractor_values": values[1:]})


def list_then_answer_question(key: str) -> str:
    return (f"Question: What is the special magic number for {key} mentioned in the provided text? Think step by "
            "step before answering: go through the text from its beginning and write one sentence for each "
            "special magic number you find, naming its key and its number, in the order they appear. Then say "
            f"which of them is the one for {key}, and end with a final line of the form \"Answer: <number>\".")


@register_task("niah_reason", f"the queried key's number among {RETRIEVAL_KEYS} needles, after a sentence per "
                              f"needle found (reasoning before the answer, cap {NIAH_REASON_TOKENS} tokens)")
def niah_reasoned(fmt, target, rng, index):
    keys = key_words(rng, RETRIEVAL_KEYS)
    values: list[str] = []
    while len(values) < RETRIEVAL_KEYS:  # distinct, so the final answer names one needle only
        value = magic_number(rng)
        if value not in values:
            values.append(value)
    depths = needle_depths(rng, index, RETRIEVAL_KEYS)  # the asked key's needle at the controlled depth
    needles = [(d, niah_needle(k, v)) for d, k, v in zip(depths, keys, values)]
    prefix = "Let me go through the special magic numbers in the text one by one."
    ids, _ = haystack_prompt(fmt, target, Haystack(rng), needles, list_then_answer_question(keys[0]), prefix,
                             "niah_reason", intro=niah_intro())
    return Sample("niah_reason", index, ids, [[values[0]]], max_answer_tokens=NIAH_REASON_TOKENS, scorer="final_answer",
                  meta={"depth": depths[0], "asked": keys[0], "distractor_values": values[1:],
                        "needles": [{"depth": d, "key": k, "value": v} for d, k, v in zip(depths, keys, values)]})
