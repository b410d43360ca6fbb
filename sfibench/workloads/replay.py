"""Replayed real-text token streams for speed runs.

Speed does not depend on weight values, but SFI's slow steps fire at sentence boundaries, so a speed
run must feed a real token stream (teacher-forced) for the triggers to fire at natural rates. Random-
weight presets have no tokenizer of their own, so sfibench ships the shipped essays pre-tokenized by
the SmolLM2 tokenizer, with the raw bytes of every token that occurs: enough for the trigger rules.
Rebuilt by `python benchmarks/rebuild_replay.py` (needs the smollm2-135m weights installed).
"""

from __future__ import annotations

import importlib.resources
import json

import torch

from sfibench.models.tokenizer import Tokenizer

REPLAY_FILE = "replay_smollm2.json"


class ReplayTokenizer:
    """Knows only the tokens of the replay stream: their bytes, for the trigger rules."""

    eos_token_id = None

    def __init__(self, pieces: dict[int, bytes]):
        self.pieces = pieces

    def token_bytes(self, token_id: int) -> bytes:
        return self.pieces.get(token_id, b"")

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")


def load_replay(vocab_size: int, tokenizer: Tokenizer) -> tuple[torch.Tensor, Tokenizer]:
    """(token ids, tokenizer to classify them): the shipped stream when the model's vocabulary holds
    the SmolLM2 ids, else the essays encoded with the model's own tokenizer (tiny byte models)."""
    data = json.loads((importlib.resources.files("sfibench.workloads") / "data" / REPLAY_FILE).read_text())
    if max(data["ids"]) < vocab_size:
        pieces = {int(k): bytes.fromhex(v) for k, v in data["pieces"].items()}
        return torch.tensor(data["ids"]), Tokenizer(ReplayTokenizer(pieces))
    return own_stream(tokenizer), tokenizer


def own_stream(tokenizer: Tokenizer) -> torch.Tensor:
    """The shipped essays in the model's own tokens: prompts (wrapping around, as `take` does) that a model
    with real weights reads as text."""
    text = (importlib.resources.files("sfibench.workloads") / "data" / "essays_en.txt").read_text()
    return torch.tensor(tokenizer.encode(text))


def take(stream: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """`count` tokens from `start`, wrapping around the stream."""
    index = (torch.arange(count) + start) % stream.numel()
    return stream[index]


ROW_OFFSET = 1000  # tokens between the starts of two sequences' stretches of the stream


def take_rows(stream: torch.Tensor, start: int, batch: int, count: int) -> torch.Tensor:
    """`[batch, count]`: sequence b's `count` tokens from `start + ROW_OFFSET * b`, so the sequences of a
    batch replay different text (their prompts from start 0, their decode inputs from the context length)."""
    return torch.stack([take(stream, start + ROW_OFFSET * row, count) for row in range(batch)])


def step_inputs(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`rows [batch, count]` as `[count, batch]`, contiguous, in pinned memory on a CUDA device: step i's
    tokens, `step_inputs(...)[i]`, then go to the GPU without stalling the host.

    A column `rows[:, i]` would not: it is a strided view, which a copy to the GPU first gathers into fresh
    pageable memory, and a copy from pageable memory waits for the stream to drain (sfi/transfer.py). Every
    decode step at batch > 1 then started on an idle GPU, and its timed interval (CUDA events) included
    the host's planning of it."""
    steps = rows.t().contiguous()
    return steps.pin_memory() if device.type == "cuda" else steps

