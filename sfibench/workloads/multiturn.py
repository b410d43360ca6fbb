"""niah_multiturn: several questions about one long context, asked one after another.

This is the workload that separates SFI from one-shot selection. The prompt holds three needles at
well-separated depths and asks only for the first; each later question is appended (after the
model's own answer) during decoding. A method that picks its support once from the prompt's last
queries (SnapKV, or SFI without refreshes) has every reason to keep the first needle and drop the
others; a method that refreshes its selection while decoding can follow the questions.
"""

from __future__ import annotations

from sfibench.workloads.base import Sample, register_task
from sfibench.workloads.haystack import DEFAULT_DEPTHS, Haystack, depth_for, key_words, magic_number
from sfibench.workloads.needles import TOKENS_PER_NUMBER, haystack_prompt, niah_needle, niah_question

TURNS = 3


@register_task("niah_multiturn", f"{TURNS} needles asked in {TURNS} successive turns (support shifts while decoding)")
def niah_multiturn(fmt, target, rng, index):
    keys = key_words(rng, TURNS)
    values = [magic_number(rng) for _ in keys]
    first = depth_for(index, DEFAULT_DEPTHS)
    # The other needles take distinct grid depths, so every pair is at least 0.2 of the context apart.
    depths = [first] + rng.sample([d for d in DEFAULT_DEPTHS if d != first], TURNS - 1)
    needles = [(d, niah_needle(k, v)) for d, k, v in zip(depths, keys, values)]
    question, prefix = niah_question([keys[0]], plural=False)
    ids, _ = haystack_prompt(fmt, target, Haystack(rng), needles, question, prefix, "niah_multiturn")
    follow_ups = [fmt.follow_up(*niah_question([k], plural=False)) for k in keys[1:]]
    return Sample("niah_multiturn", index, ids, [[v] for v in values], max_answer_tokens=TOKENS_PER_NUMBER + 2,
                  follow_ups=follow_ups,
                  meta={"depth": first, "needles": [{"depth": d, "key": k, "value": v}
                                                     for d, k, v in zip(depths, keys, values)]})
