"""The decode loop: one token per sequence per step, attention delegated to the method.

`decode_step` is the hot path (one model call); `generate` wraps it with sampling, teacher forcing,
end-of-sequence handling and the per-step record every report is built from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.prefill import Prefilled, PromptError, restore
from sfibench.engine.sampling import Sampler
from sfibench.methods import AttentionMethod
from sfibench.metrics.labels import label
from sfibench.models.decoder import Decoder


@torch.no_grad()
def decode_step(model: Decoder, cache: KVCache, method: AttentionMethod, tokens: torch.Tensor,
                step: int) -> tuple[torch.Tensor, StepContext]:
    """Feed `tokens [B]` (one per sequence) at each sequence's next position; returns logits `[B, V]`."""
    cfg = model.config
    ctx = StepContext.for_decode(step, cache.lengths, cache.lengths_host, cfg.num_layers, cfg.num_kv_heads)
    method.plan_step(ctx)
    logits = forward_step(model, cache, method, tokens, ctx)
    cache.advance()
    return logits, ctx


def forward_step(model: Decoder, cache: KVCache, method: AttentionMethod, tokens: torch.Tensor,
                 ctx: StepContext) -> torch.Tensor:
    """One token per sequence through the model; each layer stores its K/V, then the method attends."""

    def attend(layer, q, k, v):
        ctx.layer = layer
        cache.write_step(layer, ctx.positions, k[:, :, 0], v[:, :, 0])
        with label("sfibench.attend"):  # a label for `sfibench profile`
            return method.attend(q, cache, ctx)

    return model(tokens[:, None], ctx.positions[:, None], attend)[:, -1]


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
             max_new_tokens: int, sampler: Sampler, eos_token_id: int | None = None,
             forced: torch.Tensor | None = None, keep_logits: bool = False, on_step=None) -> Trace:
    """Decode `max_new_tokens` per sequence from a prefilled (or restored) cache.

    With `forced [B, N]` the inputs are teacher-forced: step i feeds forced[:, i] whatever was
    sampled, and the method observes the forced tokens, so triggers see the real text stream.
    `on_step(index, tokens, record)` is called after each emitted token (for streaming output);
    `record` is the StepRecord of the step that produced it (None for the first, from the prefill).
    """
    if int(prefilled.lengths.max()) + max_new_tokens > cache.max_seq:
        raise PromptError(f"the cache holds {cache.max_seq} tokens, too few for the prompt plus {max_new_tokens} "
                          "new tokens; prefill with a larger max_new_tokens")
    restore(cache, prefilled)
    method.start(cache, prefilled)
    batch = prefilled.lengths.shape[0]
    logits = prefilled.last_logits
    emitted, steps, kept = [], [], []
    finished: list[int | None] = [None] * batch
    for index in range(max_new_tokens):
        record = None
        if index > 0:
            logits, ctx = decode_step(model, cache, method, tokens, step=index)
            record = _record(method, ctx)
            steps.append(record)
        sampled = sampler(logits)
        tokens = forced[:, index] if forced is not None else sampled
        emitted.append(sampled)
        if keep_logits:
            kept.append(logits.float().cpu())
        method.observe(tokens)
        for row in range(batch):
            if finished[row] is None and eos_token_id is not None and int(sampled[row]) == eos_token_id:
                finished[row] = index
        if on_step is not None:
            on_step(index, sampled, record)
        if forced is None and all(f is not None for f in finished):
            break
    return Trace(torch.stack(emitted, dim=1).cpu(), steps, kept, finished)


def _record(method: AttentionMethod, ctx: StepContext) -> StepRecord:
    if method.has_slow_steps:
        kinds = ["slow" if s else "fast" for s in ctx.slow.tolist()]
    else:
        kinds = [method.step_kind] * ctx.slow.shape[0]
    return StepRecord(kinds, ctx.tokens_read.cpu(), ctx.kv_lengths.cpu())
