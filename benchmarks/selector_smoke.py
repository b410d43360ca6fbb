"""A CUDA smoke check before a report call: the Triton Selector against the PyTorch one at the 4B shape
(36 layers, 8 KV heads, 4 rows, 30K candidates) under three settings; prints the share of positions they
agree on (1.0 expected). `python benchmarks/selector_smoke.py` (exits non-zero below 0.999)."""

import dataclasses

import torch

from sfibench.config import SelectorConfig
from sfibench.optimized.selector_kernels import fused_select
from sfibench.sfi.selector import select

g = torch.Generator("cuda").manual_seed(0)
logits = torch.randn(36, 8, 4, 30000, device="cuda", generator=g) * 2
norms = torch.rand(36, 8, 30000, device="cuda", generator=g) * 10 + 1
for cfg in (SelectorConfig(), dataclasses.replace(SelectorConfig(), lambda_fixed=0.3), dataclasses.replace(SelectorConfig(), use_prior=False)):
    a, b = fused_select(logits, norms, 4, 2048, cfg), select(logits, norms, 4, 2048, cfg)
    overlap = (a[..., :, None] == b[..., None, :]).any(-1).float().mean().item()
    print(f"smoke {cfg.lambda_fixed=} {cfg.use_prior=}: overlap {overlap:.4f}")
    assert overlap >= 0.999, overlap
