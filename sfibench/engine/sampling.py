"""Next-token choice: greedy, or seeded temperature / nucleus sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0


class Sampler:
    def __init__(self, cfg: SamplingConfig, device):
        if cfg.temperature < 0 or not 0 < cfg.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        self.cfg = cfg
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits `[B, V]` -> token ids `[B]`."""
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
