"""Free-running or teacher-forced generation on top of the step driver.

`generate` wraps `StepDriver.step` (engine/driver.py, the hot path) with sampling, teacher forcing,
end-of-sequence handling and the per-step record every report is built from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.driver import StepDriver
from sfibench.engine.prefill import Prefilled, PromptError
from sfibench.engine.sampling import Sampler
from sfibench.engine.method import AttentionMethod
from sfibench.models.decoder import Decoder


@dataclass
class StepRecord:
    kinds: list[str]  # per sequence: prefill | dense | slow | fast | sparse
    tokens_read: torch.Tensor  # [L, B, H_kv] on the CPU
    kv_lengths: torch.Tensor  # [B]


@dataclass
class Trace:
    tokens: torch.Tensor  # [B, N] emitted token ids (the first comes from the prefill logits)
    steps: list[StepRecord] = field(default_factory=list)  # one per decode step (N - 1)
    logits: list[torch.Tensor] = field(default_factory=list)  # per emitted token [B, V], if kept
    finished_at: list[int | None] = field(default_factory=list)  # index of each sequence's EOS

    def sequence(self, row: int) -> list[int]:
        """Sequence `row`'s tokens, cut after its end-of-sequence token."""
        ids = self.tokens[row].tolist()
        end = self.finished_at[row]
        return ids if end is None else ids[: end + 1]


@torch.no_grad()
def generate(model: Decoder, cache: KVCache, method: AttentionMethod, prefilled: Prefilled,
             max_new_tokens: int, sampler: Sampler, stop_ids: frozenset[int] = frozenset(),
             forced: torch.Tensor | None = None, keep_logits: bool = False, on_step=None,
             use_graphs: bool = False) -> Trace:
    """Decode `max_new_tokens` per sequence from a prefilled (or restored) cache.

    With `forced [B, N]` the inputs are teacher-forced: step i feeds forced[:, i] whatever was
    sampled, and the method observes the forced tokens, so triggers see the real text stream.
    `on_step(index, tokens, record)` is called after each emitted token (for streaming output);
    `record` is the StepRecord of the step that produced it (None for the first, from the prefill).
    A sequence is finished at its first token in `stop_ids` (Tokenizer.stop_ids: EOS and the end of turn).
    """
    if int(prefilled.lengths.max()) + max_new_tokens > cache.max_seq:
        raise PromptError(f"the cache holds {cache.max_seq} tokens, too few for the prompt plus {max_new_tokens} "
                          "new tokens; prefill with a larger max_new_tokens")
    driver = StepDriver(model, cache, method, use_graphs)
    driver.start(prefilled)
    batch = prefilled.lengths.shape[0]
    logits = prefilled.last_logits
    emitted, steps, kept = [], [], []
    finished: list[int | None] = [None] * batch
    for index in range(max_new_tokens):
        record = None
        if index > 0:
            result = driver.step(tokens)
            logits = result.logits
            record = step_record(method, result.ctx)
            steps.append(record)
        sampled = sampler(logits)
        tokens = forced[:, index] if forced is not None else sampled
        emitted.append(sampled)
        if keep_logits:
            kept.append(logits.float().cpu())
        method.observe(tokens)
        for row in range(batch):
            if finished[row] is None and int(sampled[row]) in stop_ids:
                finished[row] = index
        if on_step is not None:
            on_step(index, sampled, record)
        if forced is None and all(f is not None for f in finished):
            break
    return Trace(torch.stack(emitted, dim=1).cpu(), steps, kept, finished)


def step_kinds(method: AttentionMethod, ctx: StepContext) -> list[str]:
    """Per sequence: "slow", "bridge" (dense, no refresh: SFI's bridge steps) or "fast" for methods with
    slow steps, else the method's one step kind."""
    if method.has_slow_steps:
        bridge = ctx.bridge.tolist() if ctx.bridge is not None else [False] * ctx.slow.shape[0]
        return ["slow" if s else "bridge" if b else "fast" for s, b in zip(ctx.slow.tolist(), bridge)]
    return [method.step_kind] * ctx.slow.shape[0]


def batch_step_kind(method: AttentionMethod, ctx: StepContext) -> str:
    """The kind a timer files a whole batch step under: the costliest any row ran ("slow": a dense read and
    a refresh, then "bridge": a dense read only), else "fast"; a method without slow steps has one kind."""
    kinds = step_kinds(method, ctx)
    return next((kind for kind in ("slow", "bridge") if kind in kinds), kinds[0])


def step_record(method: AttentionMethod, ctx: StepContext) -> StepRecord:
    """What a step did, per sequence: its kind and the tokens each (layer, KV head) read."""
    # copies: the driver reuses these buffers every step (and .cpu() of a CPU tensor is no copy)
    return StepRecord(step_kinds(method, ctx), ctx.tokens_read.to("cpu", copy=True),
                      ctx.kv_lengths.to("cpu", copy=True))
