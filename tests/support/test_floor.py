"""The weights floor: it multiplies by exactly the weights a decode step reads, and refuses bad input."""

from __future__ import annotations

import pytest
import torch

from sfibench.metrics.bytes_model import weight_bytes
from sfibench.metrics.floor import decode_gemms, gemm_weight_bytes, step_floor_seconds, weights_floor_seconds
from sfibench.models.loading import load_model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])  # tied, qkv bias, qk-norm
def test_chain_reads_the_decode_weights_except_the_norms(tiny_models, name):
    model = tiny_models[name].model
    norm_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n.endswith("norm.weight"))
    assert gemm_weight_bytes(decode_gemms(model)) + norm_bytes == weight_bytes(model.config, dtype_bytes=4)


def test_chain_shapes_follow_a_decode_step(tiny_models):
    cfg = tiny_models["tiny-qwen3"].config
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    layer = [((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h), (h, cfg.num_heads * d), (2 * inter, h), (h, inter)]
    shapes = [tuple(linear.weight.shape) for linear in decode_gemms(tiny_models["tiny-qwen3"].model)]
    assert shapes == layer * cfg.num_layers + [(cfg.vocab_size, h)]


def test_cpu_floor_is_timed_eagerly_and_says_so(tiny_models):
    model = tiny_models["tiny-qwen2"].model
    floor = weights_floor_seconds(model, batch=3, device="cpu", repeats=3)
    assert not floor["graphed"] and "eager" in floor["timing"]
    assert 0 < floor["min_seconds"] <= floor["seconds"] <= floor["max_seconds"]
    assert floor["weight_bytes"] == gemm_weight_bytes(decode_gemms(model))
    assert floor["gemms"] == 4 * model.config.num_layers + 1 and floor["repeats"] == 3
    assert step_floor_seconds(floor, kv_bytes=2e9, copy_bandwidth=1e12) == pytest.approx(floor["seconds"] + 2e-3)


def test_bad_input_is_refused(tiny_models):
    model = tiny_models["tiny-llama"].model
    with pytest.raises(ValueError, match="batch must be >= 1"):
        weights_floor_seconds(model, batch=0, device="cpu")
    with pytest.raises(ValueError, match="load the model on the device"):
        weights_floor_seconds(model, batch=1, device="cuda")
    with pytest.raises(ValueError, match="copy_bandwidth > 0"):
        step_floor_seconds({"seconds": 1e-3}, kv_bytes=1e6, copy_bandwidth=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_floor_replays_a_graph():
    model = load_model("qwen3-0.6b", device="cuda", dtype=torch.bfloat16).model
    floor = weights_floor_seconds(model, batch=1, device="cuda", repeats=5)
    assert floor["graphed"] and floor["timing"] == "CUDA-graph replay"
    # 1.2 GB of weights: more than ~0.1 ms even at 10 TB/s, less than a second on any GPU
    assert floor["weight_bytes"] / 10e12 < floor["seconds"] < 1.0
