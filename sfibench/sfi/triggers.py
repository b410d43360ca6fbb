"""When does a sequence take a slow step? (SPEC section 3, reference implementation.)

SFI decodes mostly with fast steps over a small sparse memory and occasionally takes a slow step: dense
attention whose evidence refreshes that memory. The attention support is nearly stable within a
sentence and shifts at sentence boundaries, so the default policy `punctuation_tmax` refreshes on the
first token of each new sentence, with a fallback interval `t_max` and a minimum gap `min_gap`.

Steps: the prefill is the bootstrap refresh at step 0; decode steps are 1, 2, 3, ... The caller's loop:

    sched = SlowStepScheduler(cfg, *token_classes(tokenizer, vocab_size), batch_size)
    sched.observe(first_tokens)              # sampled from the prefill logits: input of step 1
    for step in itertools.count(1):
        slow = sched.next_is_slow(step)      # [B] bool: which sequences run this step densely
        ...run the step; sequences that refreshed -> sched.record_refresh(step, refreshed)
        sched.observe(next_tokens)           # emitted by this step: input of step + 1

Split characters: SmolLM2's tokenizer keeps 。 whole but splits ？ and ！ into b"\\xef\\xbc" plus one
tail byte, and that tail byte also ends common characters (真 = e7 9c 9f), so no per-token rule can
find those boundaries (the tiny models' byte tokenizer splits every non-ASCII ender). Given the raw
bytes of each token (`token_byte_table`), the scheduler instead checks the last bytes of each
sequence's stream, which sees the ender once its final byte arrives; without them it falls back to
the per-token classes, and such sentences to the t_max interval.
"""

from __future__ import annotations

import torch

from sfibench.sfi.config import TRIGGER_POLICIES, TriggerConfig

ENDERS = (".", "?", "!", "。", "？", "！")


def _gpt2_char_to_byte() -> dict[str, int]:
    """Byte-level BPE (GPT-2 and descendants) spells each byte as one printable character; invert it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    unprintable = [b for b in range(256) if b not in table.values()]
    table.update({chr(256 + i): b for i, b in enumerate(unprintable)})
    return table


def token_byte_table(tokenizer, vocab_size: int) -> list[bytes]:
    """The raw bytes of every token id (token_classes, the scheduler's stream rule, replay streams).

    Read from the vocabulary where possible rather than from `decode([id])`, whose answer for one token
    can depend on the decoder's clean-up rules (prefix spaces, tokenization-space clean-up).
    """
    ids = list(range(vocab_size))
    if hasattr(tokenizer, "token_bytes"):  # sfibench's ByteTokenizer says it directly
        return [tokenizer.token_bytes(i) for i in ids]
    has_pieces = hasattr(tokenizer, "convert_ids_to_tokens")
    pieces = tokenizer.convert_ids_to_tokens(ids) if has_pieces else [None] * vocab_size
    char_to_byte = _gpt2_char_to_byte()
    byte_level = "Ġ" in pieces  # only a byte-level vocabulary spells the space as "Ġ"
    out = []
    for i, piece in zip(ids, pieces):
        if byte_level and piece is not None and all(c in char_to_byte for c in piece):
            out.append(bytes(char_to_byte[c] for c in piece))
        else:  # special tokens, ids past the tokenizer's vocabulary, non-byte-level tokenizers
            out.append(tokenizer.decode([i]).encode("utf-8"))
    return out


ENDER_BYTES = tuple(e.encode("utf-8") for e in ENDERS)


def token_classes(tokenizer, vocab_size: int,
                  table: list[bytes] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(is_ender, is_blank)`, bool `[vocab_size]`, built from the tokenizer's own vocabulary
    (or from its `token_byte_table`, when the caller already has it).

    Ender: the text, stripped of *all* trailing whitespace (not only newlines: ". " or ".\\t" end a
    sentence just the same), ends with one of ENDERS. Blank: non-empty and pure whitespace. A partial
    UTF-8 character decodes to U+FFFD, so a token holding only part of an ender is not an ender.
    """
    table = table if table is not None else token_byte_table(tokenizer, vocab_size)
    texts = [raw.decode("utf-8", errors="replace") for raw in table]
    is_ender = torch.tensor([t.rstrip().endswith(ENDERS) for t in texts], dtype=torch.bool)
    is_blank = torch.tensor([t.isspace() for t in texts], dtype=torch.bool)  # "".isspace() is False
    return is_ender, is_blank


class SlowStepScheduler:
    """Per-sequence trigger state for a batch; in one step some sequences may be slow, others fast.

    State lives in small CPU tensors (the reference favours clarity); token and mask arguments may
    live on any device, and `next_is_slow` returns a CPU mask.
    """

    def __init__(self, cfg: TriggerConfig, is_ender: torch.Tensor, is_blank: torch.Tensor, batch_size: int,
                 token_bytes: list[bytes] | None = None):
        if cfg.policy not in TRIGGER_POLICIES:
            raise ValueError(f"unknown trigger policy {cfg.policy!r}; valid policies: "
                             f"{', '.join(TRIGGER_POLICIES)}")
        self.cfg = cfg
        self.is_ender, self.is_blank = is_ender.cpu(), is_blank.cpu()
        self.token_bytes = token_bytes
        self.stream_tail = [b""] * batch_size  # last bytes of each sequence's non-blank text
        self.last_refresh = torch.zeros(batch_size, dtype=torch.long)  # the prefill refreshed at step 0
        self.decode_refreshes = torch.zeros(batch_size, dtype=torch.long)
        self.after_ender = torch.zeros(batch_size, dtype=torch.bool)  # last non-blank token was an ender
        # The last observed token opened a sentence, so the next step (whose input it is) wants a
        # refresh. It lives for one step only: a boundary refused by min_gap is dropped, not deferred,
        # because once the gap has passed the step is mid-sentence and the point of refreshing at a
        # sentence start is gone; t_max still bounds how stale the memory gets.
        self.sentence_start = torch.zeros(batch_size, dtype=torch.bool)
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def next_is_slow(self, step: int) -> torch.Tensor:
        """Which sequences take a slow step at decode step `step` (call once per step, before it runs)."""
        since = step - self.last_refresh
        if self.cfg.policy == "punctuation_tmax":
            wanted = self.sentence_start | (since >= self.cfg.t_max)
        elif self.cfg.policy == "fixed":
            wanted = since >= self.cfg.interval
        elif self.cfg.policy == "random":  # draws every step for every sequence: reproducible per seed
            draws = torch.rand(len(since), generator=self.generator)
            wanted = draws < 1.0 / self.cfg.interval
        else:  # bootstrap: the prefill's selection is used for the whole generation
            wanted = torch.zeros_like(self.sentence_start)
        # The gap holds for every policy, whatever asked for the refresh; the realised mean interval
        # (mean_interval) shows its effect, e.g. on `fixed` with interval < min_gap.
        return wanted & (since >= self.cfg.min_gap)

    def record_refresh(self, step: int, mask: torch.Tensor) -> None:
        """The sequences in `mask` refreshed at `step`; steps must come in increasing order."""
        refreshed = mask.detach().cpu().bool() & (step > self.last_refresh)  # a repeat counts once
        self.decode_refreshes += refreshed.long()
        self.last_refresh = torch.where(refreshed, step, self.last_refresh)

    def observe(self, tokens: torch.Tensor) -> None:
        """`tokens` [B] were emitted by the step just run; each is the input of the next step."""
        tokens = tokens.detach().cpu().long()
        ender, blank = self.is_ender[tokens], self.is_blank[tokens]
        if self.token_bytes is not None:
            ender = self._stream_enders(tokens, blank)
        # Blank tokens change nothing, so in "Hello.\n\nNext" the sentence starts at "Next"; a run of
        # enders ("...", "?!") keeps after_ender set and so makes one boundary.
        self.sentence_start = self.after_ender & ~ender & ~blank
        self.after_ender = ender | (self.after_ender & blank)

    def _stream_enders(self, tokens: torch.Tensor, blank: torch.Tensor) -> torch.Tensor:
        """Per sequence: does its text now end (before trailing whitespace) with an ender?"""
        ender = torch.zeros_like(blank)
        for row, token in enumerate(tokens.tolist()):
            if blank[row]:
                continue
            tail = (self.stream_tail[row] + self.token_bytes[token]).rstrip()[-8:]
            self.stream_tail[row] = tail
            ender[row] = tail.endswith(ENDER_BYTES)
        return ender

    def mean_interval(self) -> float | None:
        """Realised mean steps between refreshes (prefill = step 0), pooled over sequences.

        Each sequence's intervals sum to its last refresh step, so the mean is a ratio of two sums; the
        open stretch after the last refresh is not counted. None if no decode step refreshed.
        """
        count = int(self.decode_refreshes.sum())
        return None if count == 0 else int(self.last_refresh.sum()) / count
