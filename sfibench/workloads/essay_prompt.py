"""The prompt `sfibench generate` continues when given none: the opening of the shipped English essays.

Prose, so SFI's sentence triggers fire as they would on real text, and long enough that SFI at its
default k_head = 2048 really reads a sparse memory: below n_sink + k_head + n_recent = 2,308 tokens
every method reads the whole context and there is nothing to see.
"""

from __future__ import annotations

import importlib.resources

from sfibench.models.tokenizer import Tokenizer

DEFAULT_PROMPT_TOKENS = 2560
_CHARS_PER_TOKEN_AT_MOST = 8  # read only a prefix of the file: no tokenizer here packs more per token


def essay_prompt(tokenizer: Tokenizer, tokens: int = DEFAULT_PROMPT_TOKENS, chat: bool = False) -> list[int]:
    """The first `tokens` tokens of the essays, cut at a token boundary, optionally in the chat template."""
    text = (importlib.resources.files("sfibench.workloads") / "data" / "essays_en.txt").read_text(encoding="utf-8")
    head = tokenizer.decode(tokenizer.encode(text[:tokens * _CHARS_PER_TOKEN_AT_MOST])[:tokens])
    return tokenizer.encode(head, chat=chat)
