"""The segments `sfibench stability` analyses: one prompt each, and what follows it.

Without contexts there is one segment, as the text gives it: its first `prefix` tokens, then `steps`
more (teacher-forced) or the model's own continuation. With contexts, each context C gets a
`C - steps`-token prompt:

- prose: the text's last `steps` tokens are held out as the teacher-forced continuation, and the prompt
  is the text just before them, repeated from the front as often as C needs (the shipped essays hold
  about 11.5K tokens of Gemma's tokenizer, so 16K and 32K prompts repeat them), so the analysed tokens
  never appear in the history for attention to copy; generated text continues the same prompt;
- a quality task (sfibench/workloads): `samples` of its prompts sized to `C - steps` tokens, always
  continued by the model (there is no reference text to force), its answer (the first
  `max_answer_tokens` steps) greedily as `sfibench quality` writes it, the rest sampled. Where the first
  answer's value sits in the prompt, its tokens are the needle watched at those answer steps.

Prompts start with the BOS token the tokenizer adds by default (Gemma's models expect it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sfibench.metrics.stability import PROSE, StabilityConfig, StabilityInputError
from sfibench.sfi.config import TriggerConfig
from sfibench.sfi.triggers import SlowStepScheduler
from sfibench.workloads.base import PromptFormat, default_bos
from sfibench.workloads.tasks import get_task, make_samples


@dataclass
class Segment:
    """One prompt and what follows it."""

    prompt_source: str  # PROSE or a task name
    context: int | None  # the context asked for (None: the prefix + steps of the text)
    prompt: list[int]
    forced: list[int] | None = None  # teacher-forced tokens after the prompt; None: the model writes them
    sample: int | None = None  # the task's sample index
    needle: dict = field(default_factory=dict)  # positions, answer_steps, answers, depth (tasks with a needle)
    greedy_steps: int = 0  # the first steps decoded greedily (a task's answer)

    @property
    def mode(self) -> str:
        return "teacher-forced" if self.forced is not None else "generated"

    @property
    def label(self) -> str:
        context = f"{self.context // 1024}K" if self.context and self.context % 1024 == 0 else self.context
        parts = [str(context) if context else "", self.prompt_source if self.sample is None
                 else f"{self.prompt_source} #{self.sample}", "forced" if self.forced is not None else "generated"]
        return " ".join(part for part in parts if part)


def check_prompt_sources(cfg: StabilityConfig) -> None:
    """Every prompt source is the prose or a known task (UnknownTaskError names the valid ones)."""
    for source in cfg.prompts:
        if source != PROSE:
            get_task(source)


def build_segments(cfg: StabilityConfig, tokenizer, ids: list[int]) -> list[Segment]:
    """Every segment of the analysis, shortest context first; `ids` is the whole text, tokenised."""
    if not cfg.contexts:
        forced = None if cfg.generate else ids[cfg.prefix:cfg.prefix + cfg.steps]
        return [Segment(PROSE, None, ids[:cfg.prefix], forced)]
    bos = default_bos(tokenizer)
    fmt = PromptFormat(tokenizer, chat=False)  # raw completion with the task's answer prefix
    segments = []
    for context in sorted(cfg.contexts):
        length = context - cfg.steps
        for source in cfg.prompts:
            if source == PROSE:
                segments.append(_prose(cfg, ids, bos, context, length))
                continue
            for sample in make_samples(source, fmt, length, cfg.samples, cfg.seed):
                segments.append(Segment(source, context, sample.prompt, None, sample.index,
                                        _needle(tokenizer, sample), greedy_steps=sample.max_answer_tokens))
    return segments


def _prose(cfg: StabilityConfig, ids: list[int], bos: list[int], context: int, length: int) -> Segment:
    if len(ids) <= cfg.steps:
        raise StabilityInputError(f"the text has {len(ids)} tokens, but {cfg.steps} of them are held out as the "
                                  "steps after the prompt and some must remain for the prompt; give a longer "
                                  "--text-file or fewer --steps")
    body, tail = ids[:-cfg.steps], ids[-cfg.steps:]
    fill = length - len(bos)
    prompt = bos + (body * -(-fill // len(body)))[-fill:]  # the text just before the tail, repeated as needed
    return Segment(PROSE, context, prompt, None if cfg.generate else tail)


def value_positions(tokenizer, prompt: list[int], value: str) -> list[int]:
    """Where `value` sits in `prompt` as tokens (its first occurrence, spelled with or without a leading
    space; a leading-space token of its own is not part of it); [] when it is not there as tokens."""
    for spelled in (" " + value, value):
        ids = tokenizer.encode(spelled)
        while ids and not tokenizer.decode(ids[:1]).strip():
            ids = ids[1:]
        for start in range(len(prompt) - len(ids) + 1) if ids else ():
            if prompt[start:start + len(ids)] == ids:
                return list(range(start, start + len(ids)))
    return []


def _needle(tokenizer, sample) -> dict:
    answers = sample.answers[0] if sample.answers else []
    positions = value_positions(tokenizer, sample.prompt, answers[0]) if answers else []
    if not positions:
        return {}
    return {"value": answers[0], "answers": answers, "positions": positions,
            "answer_steps": sample.max_answer_tokens, "depth": sample.meta.get("depth")}


def sentence_starts(tokens: list[int], is_ender: torch.Tensor, is_blank: torch.Tensor) -> int:
    """How many tokens of `tokens` open a sentence (SPEC 3's sentence rule)."""
    rule = SlowStepScheduler(TriggerConfig(), is_ender, is_blank, 1)
    starts = 0
    for token in tokens:
        rule.observe(torch.tensor([token]))
        starts += bool(rule.sentence_start[0])
    return starts


def matched_interval(segment: Segment, is_ender: torch.Tensor, is_blank: torch.Tensor) -> int:
    """The fixed trigger's interval at the sentence trigger's rate: exactly, over the forced tokens; for
    generated text, ahead of it, from the prompt's own sentences (the report shows both realised rates)."""
    tokens = segment.forced if segment.forced is not None else segment.prompt
    starts = sentence_starts(tokens, is_ender, is_blank)
    return max(1, round(len(tokens) / starts)) if starts else len(tokens) + 1  # no sentence: no refresh
