"""Haystacks of natural English prose, built offline from the essays shipped in workloads/data.

A haystack is a run of consecutive sentences of the essays, starting at a seeded sentence and wrapping
around the corpus when a long context needs more text than one pass holds (the essays are ~11.7K
tokens of smollm2's tokenizer; a 32K haystack repeats them, which the report states). Needles are
whole sentences inserted at sentence boundaries chosen by depth: depth 0.0 puts a needle before the
first filler sentence, 1.0 after the last, 0.5 at the boundary nearest the middle by characters.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from importlib import resources

# The classic passkey filler (Mohtashami & Jaggi, 2023): deliberately repetitive, not natural text.
PASSKEY_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@lru_cache(maxsize=1)
def essay_sentences() -> tuple[str, ...]:
    """Every sentence of essays_en.txt in order; titles (lines without a full stop) are dropped."""
    text = resources.files("sfibench.workloads").joinpath("data/essays_en.txt").read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in text.split("\n") if p.strip().endswith((".", "?", "!"))]
    sentences = []
    for paragraph in paragraphs:
        # Split after . ? ! when a capital letter follows (the essays hold no quotations).
        sentences += [s.strip() for s in re.split(r"(?<=[.?!])\s+(?=[A-Z])", paragraph) if s.strip()]
    return tuple(sentences)


@lru_cache(maxsize=1)
def essay_vocabulary() -> tuple[str, ...]:
    """Distinct lowercase words of 4-10 letters from the essays, sorted (a natural word list)."""
    words = {w.lower() for s in essay_sentences() for w in re.findall(r"[A-Za-z]+", s)}
    return tuple(sorted(w for w in words if 4 <= len(w) <= 10))


class Haystack:
    """Filler sentences from a seeded start in the essay corpus, with needles placed by depth."""

    def __init__(self, rng: random.Random, sentences: tuple[str, ...] | None = None):
        self.sentences = sentences or essay_sentences()
        self.start = rng.randrange(len(self.sentences))

    def filler(self, words: int) -> list[str]:
        """Sentences holding the first `words` filler words (wrapping around the corpus).

        Counted in words, not sentences, so a fit can land within a few tokens of its target; only
        the last sentence may be cut short.
        """
        out, index = [], self.start
        while words > 0:
            sentence = self.sentences[index % len(self.sentences)].split(" ")
            out.append(" ".join(sentence[:words]))
            words -= len(sentence)
            index += 1
        return out

    def render(self, words: int, needles: list[tuple[float, str]]) -> str:
        """`words` filler words with each (depth, needle sentence) inserted at its depth."""
        return insert_at_depths(self.filler(words), needles)


def insert_at_depths(filler: list[str], needles: list[tuple[float, str]]) -> str:
    """Join `filler` with spaces, inserting each needle at the boundary nearest its depth (by chars)."""
    for depth, _ in needles:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"needle depth must lie in [0, 1], got {depth}")
    # Character offset of each boundary: boundary i sits before filler[i] (boundary n = the end).
    offsets, total = [], 0
    for sentence in filler:
        offsets.append(total)
        total += len(sentence) + 1
    offsets.append(total)
    at: dict[int, list[str]] = {}
    for depth, needle in needles:
        boundary = min(range(len(offsets)), key=lambda i: abs(offsets[i] - depth * total))
        at.setdefault(boundary, []).append(needle)
    pieces = []
    for i in range(len(filler) + 1):
        pieces += at.get(i, [])
        if i < len(filler):
            pieces.append(filler[i])
    return " ".join(pieces)


def noise(n: int) -> list[str]:
    """The first `n` sentences of the passkey noise repeated (sentences, so the fit is fine-grained)."""
    sentences = [s + "." for s in PASSKEY_NOISE.rstrip(".").split(". ")]
    return [sentences[i % len(sentences)] for i in range(n)]


def depth_for(index: int, depths: tuple[float, ...]) -> float:
    """Controlled placement: sample i uses depths[i % len(depths)], so every depth gets equal samples."""
    return depths[index % len(depths)]


DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


def magic_number(rng: random.Random, digits: int = 7) -> str:
    """A random number of exactly `digits` digits (no leading zero) as RULER's 'special magic number'."""
    return str(rng.randrange(10 ** (digits - 1), 10 ** digits))


def key_words(rng: random.Random, count: int) -> list[str]:
    """`count` distinct keys for needles, e.g. 'amber-lantern' (two essay words, hyphenated)."""
    vocab = essay_vocabulary()
    keys: list[str] = []
    while len(keys) < count:
        key = f"{rng.choice(vocab)}-{rng.choice(vocab)}"
        if key not in keys:
            keys.append(key)
    return keys
