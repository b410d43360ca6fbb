"""The step floor: the fastest a decode step could be on this device, measured (SPEC section 7).

A decode step reads every weight once and, per sequence, the K/V its attention reads. The byte
roofline at copy bandwidth is one bound, but matrix-vector products at decode shapes do not reach
copy bandwidth (cuBLAS about 72% on an H200 for the Qwen3-4B shape, gemv.py's kernel 81%), so the
weights part is measured: the decoder's own weight matrices, in the stacked form it multiplies by
(qkv, o, gate_up, down per layer, then the LM head), through the kernel the decoder uses for them
(`fused.ops["linear"]`), run back to back at the run's batch from one CUDA graph, so no launch gap or
Python is timed. `step_floor_seconds` adds the step's K/V bytes at the measured copy bandwidth; what a
step takes beyond that is engine overhead every method pays (norms, RoPE, cache writes, launches).
Under tensor parallelism each rank's floor is its own share (its projections, its KV heads) plus the
all-reduces a step cannot avoid, measured (`all_reduce_seconds`): two a layer, after o_proj and down_proj.

Each product's input is the leading columns of the previous one's output (the q heads of qkv feed
o_proj, the gate half feeds down_proj), so the chain is ordered like a real step. It reads every byte
of `bytes_model.weight_bytes` except the RMSNorm weights (under 0.01% of a 4B model), which the
elementwise kernels read. Weights small enough to stay in L2 (tiny test models) make the floor
optimistic; real shapes are far larger than L2. On the CPU nothing is graphed: the chain is timed
eagerly, and the result says so.
"""

from __future__ import annotations

import torch
from torch import nn

from sfibench.core.parallel import TensorParallel
from sfibench.metrics.stats import spread
from sfibench.metrics.timing import time_region
from sfibench.models import fused
from sfibench.models.decoder import Decoder


def decode_gemms(model: Decoder) -> list[nn.Linear]:
    """The projections one decode step multiplies by, in order: per layer qkv, o, gate_up, down; the LM head."""
    per_layer = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
                 for layer in model.model.layers]
    return [linear for layer in per_layer for linear in layer] + [model.lm_head]


def gemm_weight_bytes(gemms: list[nn.Linear]) -> int:
    """Bytes of the weights and biases the chain reads."""
    return sum(p.numel() * p.element_size() for linear in gemms for p in linear.parameters())


def graph_replay(fn):
    """Capture `fn` in a CUDA graph and return its replay. cuBLAS sets up its handles and workspace on
    the first call, which must not happen inside a capture, hence the warm-up on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()

    def replay() -> torch.Tensor:
        graph.replay()
        return output  # referenced here so its memory stays the graph's while replays write it

    return replay


def gemm_chain(model: Decoder, batch: int, device: torch.device, gemms: list | None = None):
    """A callable running `gemms` (default `decode_gemms(model)`) back to back at `batch` rows, each through the
    decoder's own kernel (cuBLAS, or gemv.py's when fused), each product's input the leading columns of the one
    before's output."""
    gemms = decode_gemms(model) if gemms is None else gemms
    source = torch.randn(batch, model.config.hidden_size, device=device, dtype=model.lm_head.weight.dtype)

    def chain() -> torch.Tensor:
        hidden = source
        for linear in gemms:
            hidden = fused.ops["linear"](hidden[:, :linear.in_features], linear.weight, linear.bias)
        return hidden

    return chain


@torch.no_grad()
def weights_floor_seconds(model: Decoder, batch: int, device: torch.device | str, repeats: int = 20) -> dict:
    """Time the chain of `decode_gemms` at `batch` sequences: a CUDA-graph replay per repeat on a GPU,
    eager calls on the CPU. Returns the median ("seconds") and spread of the repeats, and what was timed."""
    device = torch.device(device)
    weights = model.lm_head.weight
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if weights.device.type != device.type or device.index not in (None, weights.device.index):
        raise ValueError(f"the model's weights are on {weights.device}, not {device}: load the model on the "
                         "device the floor is measured on")
    gemms = decode_gemms(model)
    chain = gemm_chain(model, batch, device, gemms)
    graphed = device.type == "cuda"
    seconds = spread(time_region(graph_replay(chain) if graphed else chain, device, warmup=2, repeats=repeats))
    return {
        "seconds": seconds["median"], "min_seconds": seconds["min"], "max_seconds": seconds["max"],
        "rel_spread": seconds["rel_spread"], "repeats": repeats, "batch": batch, "gemms": len(gemms),
        "weight_bytes": gemm_weight_bytes(gemms), "graphed": graphed,
        "timing": "CUDA-graph replay" if graphed else f"eager on {device.type} (no CUDA graph): indicative only",
    }


@torch.no_grad()
def all_reduce_seconds(parallel: TensorParallel, batch: int, hidden_size: int, per_step: int,
                       dtype: torch.dtype, device: torch.device, repeats: int = 20) -> dict:
    """Time the all-reduce of one row-parallel layer's output (`batch` rows of `hidden_size`) over the ranks,
    every rank calling it together: the median ("seconds") and spread of one, and `step_seconds` for the
    `per_step` a decode step runs."""
    rows = torch.randn(batch, hidden_size, device=device, dtype=dtype)
    seconds = spread(time_region(lambda: parallel.all_reduce(rows), device, warmup=2, repeats=repeats))
    return {"seconds": seconds["median"], "rel_spread": seconds["rel_spread"], "repeats": repeats,
            "batch": batch, "bytes": rows.numel() * rows.element_size(), "per_step": per_step,
            "step_seconds": seconds["median"] * per_step}


def step_floor_seconds(floor: dict, kv_bytes: float, copy_bandwidth: float) -> float:
    """The weights floor plus the step's K/V bytes at the measured copy bandwidth (bytes/s)."""
    if copy_bandwidth <= 0 or kv_bytes < 0:
        raise ValueError(f"need copy_bandwidth > 0 and kv_bytes >= 0, got {copy_bandwidth} and {kv_bytes}")
    return floor["seconds"] + kv_bytes / copy_bandwidth
