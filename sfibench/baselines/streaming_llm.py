"""StreamingLLM: attention sinks plus a sliding window of the most recent tokens.

Evicts everything else for good, so it can never look back at a needle that slid out of the window.
Keys keep the RoPE of their original positions (no re-rotation into the cache), which reports state.
The budget is the tokens read per (layer, KV head): sinks + window, matched to SFI's.

The optimized path keeps only the sinks and the window of each prompt (engine/compact.py): in the compact
cache the sinks are still the first slots and the window the last ones, so the same kernel reads them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sfibench.baselines.tail_segment import TwoSegmentPath
from sfibench.core.budget import BudgetError
from sfibench.engine.method import AttentionMethod, AttentionView, MethodConfig, MethodDef, RecallMemory
from sfibench.engine.workspace import gather_attention_bytes
from sfibench.optimized.triton_device import require_triton_device
from sfibench.reference.sparse_memory import attend_fixed_plus_tail


@dataclass(frozen=True)
class StreamingLLMConfig(MethodConfig):
    """Sinks plus a recent window; budget = n_sink + window, matched to SFI's tokens read."""

    n_sink: int = 4
    budget: int = 2308  # tokens read per (layer, KV head): SFI's default 4 + 2048 + 256

    def with_budget(self, budget: int) -> StreamingLLMConfig:
        if budget <= self.n_sink:
            raise BudgetError(f"a budget of {budget} tokens leaves StreamingLLM no window beside its "
                              f"{self.n_sink} sinks; raise it")
        return dataclasses.replace(self, budget=budget)

    def tokens_read(self, context: int) -> int:
        return min(self.budget, context)

    def workspace_bytes(self, model_config, path: str, dtype_bytes: int, batch: int, max_seq: int,
                        prompt: int) -> int:
        """The reference path gathers the sinks and window of every sequence and KV head each layer; the
        optimized kernel reads them in place."""
        if path != "reference":
            return 0
        mc = model_config
        return gather_attention_bytes(batch, mc.num_heads, mc.num_kv_heads, min(self.budget, max_seq), mc.head_dim,
                                      dtype_bytes)

    def recall_memory(self, selection_budget) -> RecallMemory:
        return StreamingRecall(self)

    def compact_slots(self, path: str) -> int | None:
        return self.budget if path == "optimized" else None


class StreamingRecall(RecallMemory):
    """Sinks + the most recent tokens, as many in all as the budget reference's memory reads."""

    names = ("streaming",)
    labels = {"streaming": "StreamingLLM"}

    def __init__(self, cfg: StreamingLLMConfig):
        self.cfg = cfg

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        if view.budget is None:
            return None
        length = view.logits.shape[-1]
        positions = torch.arange(length, device=view.logits.device)
        window = view.budget - self.cfg.n_sink
        return {"streaming": (positions < self.cfg.n_sink) | (positions >= length - window)}


class StreamingLLM(AttentionMethod):
    name = "streaming_llm"

    def __init__(self, config, model_config, tokenizer):
        super().__init__(config, model_config, tokenizer)
        if config.budget <= config.n_sink:
            raise ValueError(f"StreamingLLM budget ({config.budget}) must exceed its {config.n_sink} sink tokens")

    def attend(self, q: torch.Tensor, cache, ctx, plan) -> torch.Tensor:
        # Every size comes from the configuration, so the default plan (no static sizes) serves every step.
        batch, kv_heads = cache.batch, cache.k.shape[2]
        sinks = torch.arange(self.cfg.n_sink, device=q.device).expand(batch, kv_heads, -1)
        sinks_valid = sinks < ctx.kv_lengths[:, None, None]
        window_start = (ctx.kv_lengths - (self.cfg.budget - self.cfg.n_sink)).clamp(min=self.cfg.n_sink)
        out, read = attend_fixed_plus_tail(q, cache.k[ctx.layer], cache.v[ctx.layer], sinks, sinks_valid,
                                           window_start, ctx.kv_lengths, self.cfg.budget - self.cfg.n_sink)
        ctx.tokens_read[ctx.layer] = read
        return out


class OptimizedStreamingLLM(TwoSegmentPath, StreamingLLM):
    """The sinks already lie contiguous at the start of the cache: the kernel reads them in place (a view)."""

    def start(self, cache, prefilled) -> None:
        require_triton_device(cache.k.device)
        self.choose_splits(cache, self.cfg.budget)
        mc, device = self.model_config, cache.k.device
        self.state("counts", (1, mc.num_layers, cache.batch, mc.num_kv_heads), torch.int32, device)
        self.state("tail", (1, cache.batch), torch.int32, device)
        self.state("row_buffer", (cache.batch,), torch.int32, device)

    def keep(self, cache, prefilled, row: int) -> tuple[torch.Tensor, int]:
        """The sinks, and the prompt's last `window` tokens after them (its whole if the budget holds it)."""
        length, mc = int(prefilled.lengths[row]), self.model_config
        sinks = min(self.cfg.n_sink, length)
        fixed = torch.arange(sinks, device=cache.k.device).expand(mc.num_layers, mc.num_kv_heads, -1)
        return fixed, max(sinks, length - (self.cfg.budget - self.cfg.n_sink))

    def compact(self, cache, layer: int):
        sinks = slice(0, self.cfg.n_sink)
        return cache.k[layer, :, :, sinks][None], cache.v[layer, :, :, sinks][None]

    @property
    def moving_segments(self) -> tuple[int, int]:
        """(n_sink, window): the sinks are the first min(L, n_sink) slots, the window the last `window` slots
        after them."""
        return self.cfg.n_sink, self.cfg.budget - self.cfg.n_sink


METHOD = MethodDef(name="streaming_llm", summary="attention sinks + a sliding window of recent tokens",
                   config=StreamingLLMConfig,
                   paths={"reference": StreamingLLM, "optimized": OptimizedStreamingLLM})
