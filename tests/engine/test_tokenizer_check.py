"""A tokenizer that decodes every id but segments text wrongly is refused at load, not run.

transformers 5.17 converts Gemma-3's GGUF tokenizer into one that splits words into two-character
pieces; the model then answers nonsense with no error (reports/diagnostics/gemma3-h200-mismatch).
"""

from __future__ import annotations

import pytest

from sfibench.models.tokenizer import BrokenTokenizerError, Tokenizer, check_round_trip

WORDS = [f" {a}{b}{c}{d}" for a in "bcdfg" for b in "aeiou" for c in "lmnrs" for d in "tk"]  # 250 words


class WordTokenizer:
    """ids 0..249: whole words; 250..: every two-letter piece. `split` mimics the broken converter."""

    eos_token_id = None

    def __init__(self, split: bool):
        self.split = split
        self.pieces = sorted({w[i:i + 2] for w in WORDS for i in (0, 2, 4)} | {w[4:] for w in WORDS})
        self.vocab = WORDS + self.pieces

    def __call__(self, text, add_special_tokens=False):
        if not self.split and text in WORDS:
            return {"input_ids": [WORDS.index(text)]}
        chunks = [text[i:i + 2] for i in range(0, len(text), 2)]
        return {"input_ids": [len(WORDS) + self.pieces.index(c) for c in chunks]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[i] for i in ids)


def test_a_tokenizer_that_encodes_its_words_back_passes():
    backend = WordTokenizer(split=False)
    check_round_trip(Tokenizer(backend), len(backend.vocab), "words.gguf")


def test_a_tokenizer_that_splits_its_own_words_is_refused_with_the_fix():
    backend = WordTokenizer(split=True)
    with pytest.raises(BrokenTokenizerError, match=r"words\.gguf does not encode its own vocabulary.*transformers"):
        check_round_trip(Tokenizer(backend), len(backend.vocab), "words.gguf")


def test_the_real_smollm2_tokenizer_passes(smollm2):
    check_round_trip(smollm2.tokenizer, smollm2.config.vocab_size, "smollm2")
