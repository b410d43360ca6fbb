"""Aggregation tasks from RULER: common-words and frequent-words extraction.

Neither has a needle: the answer depends on counting over the whole context, so a method that keeps
a small part of it can only guess. The word lists grow with the target length; the fitter picks how
many distinct words fill the context.

- cwe: a numbered list of essay words; 10 common words make up half the list, every other word
  appears at most 3 times. Answer: the 10 common words.
- fwe: "coded" letter strings with Zipf frequencies (exponent 2); answer: the 3 most frequent.
"""

from __future__ import annotations

import random
import string

from sfibench.workloads.base import Sample, fit_to_tokens, register_task
from sfibench.workloads.haystack import essay_vocabulary

COMMON = 10
UNCOMMON_REPEATS = 3
TOP = 3
ZIPF = 2.0
CODED_WORDS = 100


@register_task("cwe", f"common-words extraction: the {COMMON} most common words of a long list")
def common_words(fmt, target, rng, index):
    vocab = list(essay_vocabulary())
    rng.shuffle(vocab)
    common, pool, seed = vocab[:COMMON], vocab[COMMON:], rng.random()

    def render(n: int) -> list[int]:
        # n list items: the common words fill half (round-robin, at least UNCOMMON_REPEATS + 1 times each),
        # the other half cycles through uncommon words UNCOMMON_REPEATS times each.
        n_common = max(n // 2, COMMON * (UNCOMMON_REPEATS + 1))
        items = [common[i % COMMON] for i in range(n_common)]
        items += [pool[i // UNCOMMON_REPEATS] for i in range(max(n - n_common, 0))]
        random.Random(f"{seed}/{n}").shuffle(items)
        listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))
        return fmt.first_turn(
            "Below is a numbered list of words. In these words, some appear more often than others. Memorize "
            f"the ones that appear most often.\n{listing}\nQuestion: What are the {COMMON} most common words "
            "in the above list?", f"Answer: The top {COMMON} words that appear most often in the list are:")

    n, ids = fit_to_tokens(render, target, most=2 * UNCOMMON_REPEATS * len(pool), what="cwe")
    return Sample("cwe", index, ids, [common], max_answer_tokens=4 * COMMON, meta={"list_items": n})


@register_task("fwe", f"frequent-words extraction: the {TOP} most frequent coded words (Zipf)")
def frequent_words(fmt, target, rng, index):
    vocab: list[str] = []
    while len(vocab) < CODED_WORDS:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 6)))
        if word not in vocab:
            vocab.append(word)
    seed = rng.random()

    def render(n: int) -> list[int]:
        # n words in all; rank r gets a share proportional to 1 / r^ZIPF (at least one occurrence).
        weights = [1 / (r + 1) ** ZIPF for r in range(len(vocab))]
        total = sum(weights)
        items = [w for w, wt in zip(vocab, weights) for _ in range(max(1, round(n * wt / total)))]
        random.Random(f"{seed}/{n}").shuffle(items)
        return fmt.first_turn(
            "Read the following coded text and track the frequency of each coded word. Find the three most "
            f"frequently appeared coded words. {' '.join(items)}\nQuestion: Do not provide any explanation. "
            "What are the three most frequently appeared words in the above coded text?",
            "Answer: According to the coded text above, the three most frequently appeared words are:")

    n, ids = fit_to_tokens(render, target, most=target, what="fwe")
    return Sample("fwe", index, ids, [vocab[:TOP]], max_answer_tokens=6 * TOP, meta={"words": n})
