"""`sfibench generate` run: one method writes text after a prompt; returns the text and per-step accounting.

The command (commands/generate.py) has checked every option; what needs the tokenizer (the prompt's
length, so a percentage budget or k_head becomes tokens, and whether a budget fits the prompt) is
resolved here, before the prefill. Nothing is written to disk: the command prints the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from rich.console import Console

from sfibench import registry
from sfibench.core.budget import Budget
from sfibench.core.device import idle_cores_only, resolve_device
from sfibench.core.errors import NonFiniteOutputError
from sfibench.core.parallel import ranks
from sfibench.core.progress import starting
from sfibench.engine.method import MethodSpec
from sfibench.engine.sampling import SamplingConfig
from sfibench.engine.session import Session
from sfibench.metrics.accounting import step_stats, summarize
from sfibench.sfi.config import SFIConfig
from sfibench.workloads.essay_prompt import DEFAULT_PROMPT_TOKENS, essay_prompt

CHAT_TEMPLATE_ROOM = 64  # tokens left for a chat template's own tokens around the default prompt


@dataclass(frozen=True)
class GenerateRun:
    """Everything `sfibench generate` runs with, checked by the command."""

    model: str
    method: str
    path: str
    device: str
    dtype: str
    prompt: str | None  # None: continue the opening tokens of the shipped essays
    max_new_tokens: int
    chat: bool
    sampling: SamplingConfig
    k_head: Budget  # SFI's selected tokens per KV head, a percentage being of the prompt
    budget: Budget | None  # every sparse method's tokens read per layer and KV head (overrides k_head)
    sfi: SFIConfig  # SFI's other settings; its k_head is replaced by `k_head` resolved at the prompt
    stream: bool = True  # print the text as it is generated
    threads: int | None = None  # torch's CPU threads; None: idle_cores_only's choice


def run_generate(run: GenerateRun, console: Console, err_console: Console) -> dict:
    """Generate and return the result `--json` prints: the prompt's length, the tokens, text and step stats."""
    with ranks(resolve_device(run.device)) as parallel:
        return generate_with(Session.open(run.model, run.device, run.dtype, run.sampling.seed, parallel=parallel),
                             run, console, err_console)


def generate_with(session: Session, run: GenerateRun, console: Console, err_console: Console) -> dict:
    tokenizer = session.loaded.tokenizer
    if run.prompt is None:
        room = session.max_tokens - run.max_new_tokens - CHAT_TEMPLATE_ROOM
        ids = essay_prompt(tokenizer, max(min(DEFAULT_PROMPT_TOKENS, room), 1), run.chat)
        err_console.print(f"[dim]no --prompt: continuing the first {len(ids):,} tokens of the shipped essays[/]")
    else:
        ids = tokenizer.encode(run.prompt, chat=run.chat)
    sfi = replace(run.sfi, k_head=run.k_head.resolve(len(ids), "--k-head", at_most_context=False))
    config = sfi if run.method == registry.BUDGET_REFERENCE else registry.default_config(run.method)
    if run.budget is not None:
        config = config.with_budget(run.budget.resolve(len(ids)))
    with idle_cores_only(session.device, run.threads):  # a busy core would stall every step's threads
        threads = torch.get_num_threads()  # what the steps run on, reported beside them
        starting(f"prefill of {len(ids):,} prompt tokens")
        prefilled = session.prefill([ids], run.max_new_tokens)
        check_finite(prefilled.last_logits, session.loaded.config.name, session.dtype)
        spec = MethodSpec(run.method, run.path, config)
        method = registry.create_method(spec, session.loaded.config, tokenizer)
        trace, summary = session.decode(method, prefilled, run.max_new_tokens, run.sampling,
                                        on_step=TextStreamer(tokenizer, console, enabled=run.stream))
    tokens = trace.sequence(0)
    return {
        "model": session.loaded.config.name, "method": run.method, "path": run.path,
        "prompt_tokens": len(ids), "budget_tokens": config.tokens_read(len(ids)), "threads": threads,
        "generated_ids": tokens, "generated_text": tokenizer.readable(tokens),
        "summary": {**summarize(trace, 0), **summary}, "steps": step_stats(trace, 0)[: max(len(tokens) - 1, 0)],
    }


def check_finite(logits, model: str, dtype) -> None:
    """Refuse to write text chosen from logits that are not numbers (argmax of NaN is token 0, a NUL byte)."""
    import torch

    if not bool(torch.isfinite(logits).all()):
        fix = "try --dtype float32 (the activations may overflow), or " if dtype != torch.float32 else ""
        raise NonFiniteOutputError(f"{model}'s output after the prompt is not finite (NaN or infinity in its logits): "
                                   f"its weights hold NaN or infinity, or its activations overflow; {fix}check the "
                                   "checkpoint's weights")


class TextStreamer:
    """Prints text as tokens arrive; where the output is a terminal, text emitted by a slow (refresh) step is
    highlighted (piped or redirected text stays plain)."""

    def __init__(self, tokenizer, console: Console, enabled: bool):
        self.tokenizer, self.console, self.enabled = tokenizer, console, enabled
        self.highlight = console.is_terminal
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, index: int, tokens, record) -> None:
        if not self.enabled:
            return
        self.ids.append(int(tokens[0]))
        text = self.tokenizer.readable(self.ids)  # the whole prefix: multi-byte characters stay whole
        new, self.shown = text[len(self.shown):], text
        slow = self.highlight and record is not None and record.kinds[0] == "slow"
        self.console.print(new, end="", style="bold black on yellow" if slow else None, highlight=False,
                           markup=False)
