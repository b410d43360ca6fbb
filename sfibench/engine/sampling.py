"""Next-token choice: greedy, or seeded temperature / nucleus sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sfibench.core.parallel import SINGLE, TensorParallel


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0


class Sampler:
    def __init__(self, cfg: SamplingConfig, device, parallel: TensorParallel = SINGLE):
        if cfg.temperature < 0 or not 0 < cfg.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        self.cfg = cfg
        self.parallel = parallel
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits `[B, V]` -> token ids `[B]`. Under tensor parallelism every rank holds the gathered logits,
        and rank 0's token goes to all: each rank's method observes it, so triggers, slow/fast decisions and
        step plans stay the same on every rank even where the ranks' logits differ in the last bit."""
        tokens = self.choose(logits)
        return tokens if self.parallel.world_size == 1 else self.parallel.same_everywhere(tokens)

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cfg.temperature == 0:
            return logits.argmax(dim=-1)
        probs = (logits.float() / self.cfg.temperature).softmax(dim=-1)
        if self.cfg.top_p < 1:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (the first token always stays)
            outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= self.cfg.top_p
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
