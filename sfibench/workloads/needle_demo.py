"""A 4K-token needle-in-a-haystack prompt, and the answers methods give to it at one retention: the demo of
docs/findings.md (benchmarks/needle_demo.py prints it) and the SFI-vs-StreamingLLM test.

The haystack is whole paragraphs of the shipped essays (coherent text, which a 135M model copes
with better than shuffled sentences); the needle is a common noun, so the answer is one retrieval.
With 7-digit numbers instead, smollm2-135m under SFI at 15% retention recovers only the first digit:
each next digit needs attention on the next needle token, a support that moves within the answer,
and Soft-NMS deliberately keeps one position per neighbourhood (see the closing notes of issue 3).
"""

from __future__ import annotations

import importlib.resources
import random

from sfibench.models.tokenizer import Tokenizer

WORDS = ("apple", "river", "candle", "tiger", "silver", "garden", "rocket", "violin", "pepper", "castle",
         "anchor", "falcon", "marble", "cotton", "jacket", "helmet", "pencil", "button", "ladder", "mirror")
KEYS = ("harbor", "lantern", "orchard", "meadow", "compass")
INTRO = ("Some special magic words are hidden within the following text. Make sure to memorize it. "
         "I will quiz you about the words afterwards.")


def needle_prompt(tokenizer: Tokenizer, target_tokens: int, seed: int, depth: float) -> tuple[list[int], str]:
    """(prompt ids ending in the answer prefix, the needle word); the needle sits at `depth` of the text."""
    rng = random.Random(seed)
    word, key = rng.choice(WORDS), rng.choice(KEYS)
    text = (importlib.resources.files("sfibench.workloads") / "data" / "essays_en.txt").read_text()
    paragraphs = [p for p in text.split("\n\n") if len(p) > 200]
    chosen, tokens, index = [], 0, rng.randrange(len(paragraphs))
    while tokens < target_tokens:
        chosen.append(paragraphs[index % len(paragraphs)])
        tokens += len(tokenizer.encode(chosen[-1])) + 1
        index += 1
    chosen.insert(int(len(chosen) * depth), f"One of the special magic words for {key} is: {word}.")
    question = f"What is the special magic word for {key} mentioned in the provided text?"
    body = INTRO + "\n\n" + "\n\n".join(chosen) + "\n\n" + question
    prefix = f"The special magic word for {key} mentioned in the provided text is"
    return tokenizer.encode(body, chat=True) + tokenizer.encode(prefix), word


def answers_at_retention(session, prompt: list[int], methods: list[str], retention: float,
                         max_new_tokens: int = 6) -> dict[str, tuple[str, float]]:
    """Prefill once, then each method's greedy answer and its measured mean retention (read / L)."""
    from sfibench import registry

    prefilled = session.prefill([prompt], max_new_tokens)
    out = {}
    for method in methods:
        spec = registry.at_budget(method, "reference", round(retention * len(prompt)))
        trace, _ = session.decode(registry.create_method(spec, session.loaded.config, session.loaded.tokenizer),
                                  prefilled, max_new_tokens)
        read = [float(r.tokens_read.float().mean()) / int(r.kv_lengths[0]) for r in trace.steps]
        out[method] = (session.loaded.tokenizer.decode(trace.sequence(0)), sum(read) / len(read))
    return out

