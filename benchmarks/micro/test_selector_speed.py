"""The SFI Selector, whole (PyTorch and, on a GPU, Triton) and stage by stage, on random evidence at real
model shapes (CPU or GPU).

Shapes: one slow step of every layer at once, as the reference SFI calls it (evidence rows R = G query
heads, one decode query each). smollm2-135m at 2K tokens runs anywhere; the Qwen3-4B shape at 32K
runs only where CUDA exists (on a CPU it takes seconds per call and measures nothing useful).
"""

from __future__ import annotations

import pytest
import torch

from sfibench.sfi.config import SelectorConfig
from sfibench.sfi.selector import (
    choose_lambda,
    cross_head_exclusivity,
    fuse,
    log_prior,
    pool_evidence,
    select,
    soft_nms,
    top_k_positions,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPES = {  # name: (layers, KV heads, evidence rows G, candidates n, K)
    "smollm2-135m@2K": (30, 3, 3, 1776, 300),
    "qwen3-4b@32K": (36, 8, 4, 32496, 2048),
}


def inputs(name: str) -> dict:
    layers, heads, rows, n, k = SHAPES[name]
    if name.startswith("qwen3") and DEVICE.type != "cuda":
        pytest.skip("the Qwen3-4B shape is timed on a GPU only")
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(layers, heads, rows, n, generator=generator) * 3).to(DEVICE)
    norms = (torch.rand(layers, heads, n, generator=generator) * 10 + 1).to(DEVICE)
    return {"logits": logits, "norms": norms, "k": k, "cfg": SelectorConfig()}


def run(benchmark, cuda_sync, name: str, stage, fn) -> None:
    benchmark.extra_info.update(shape=name, stage=stage, device=str(DEVICE))

    def timed():
        result = fn()
        cuda_sync()
        return result

    benchmark(timed)


@pytest.mark.parametrize("name", SHAPES)
def test_select(benchmark, cuda_sync, name):
    x = inputs(name)
    run(benchmark, cuda_sync, name, "select", lambda: select(x["logits"], x["norms"], 4, x["k"], x["cfg"]))


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton Selector is timed on a GPU only")
def test_select_triton(benchmark, cuda_sync, name):
    from sfibench.optimized.sfi import fused_select

    x = inputs(name)
    run(benchmark, cuda_sync, name, "select (Triton)",
        lambda: fused_select(x["logits"], x["norms"], 4, x["k"], x["cfg"]))


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("stage", ["pool", "prior+fusion", "nms", "cross_head", "top_k"])
def test_stage(benchmark, cuda_sync, name, stage):
    x = inputs(name)
    cfg, rows = x["cfg"], x["logits"].shape[-2]
    log_f = pool_evidence(x["logits"], cfg.alpha)
    stages = {
        "pool": lambda: pool_evidence(x["logits"], cfg.alpha),
        "prior+fusion": lambda: fuse(log_f, log_r := log_prior(x["norms"], cfg),
                                     choose_lambda(log_f, log_r, rows, cfg), cfg.eps),
        "nms": lambda: soft_nms(log_f, cfg.nms_radius, cfg.nms_alpha),
        "cross_head": lambda: cross_head_exclusivity(log_f, cfg.cross_temperature, cfg.cross_alpha, cfg.eps),
        "top_k": lambda: top_k_positions(log_f, x["k"], 4),
    }
    run(benchmark, cuda_sync, name, stage, stages[stage])
