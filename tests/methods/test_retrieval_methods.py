"""Quest and TidalDecode, the methods that keep the whole cache and retrieve from it at every step.

Both paths must read the same positions at every (step, layer, sequence, KV head), not only emit the same
tokens; and a budget that covers the whole history must make each method Full-KV.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from method_matrix import SMALL_CONFIGS, small_spec
from test_kernels import DEVICE
from test_paths_agree import decode, decode_both, prompts_for, tiny_models  # noqa: F401  (the models on DEVICE)

from sfibench.baselines import quest, tidaldecode
from sfibench.engine.method import MethodSpec
from sfibench.reference import sparse_memory

RETRIEVAL = {"quest": quest, "tidaldecode": tidaldecode}


def read_sets(positions: torch.Tensor, keep: torch.Tensor) -> list[list[list[int]]]:
    """Per (sequence, KV head): the sorted slots read, from positions `[B, H, N]` and a mask `[B, H, N]`."""
    return [[sorted(positions[b, h][keep[b, h]].tolist()) for h in range(positions.shape[1])]
            for b in range(positions.shape[0])]


@pytest.mark.parametrize("name", sorted(RETRIEVAL))
def test_both_paths_read_the_same_positions_in_every_sparse_layer(tiny_models, monkeypatch, name):
    loaded = tiny_models["tiny-qwen3"]
    seen = {"reference": [], "optimized": []}
    gather, decode = sparse_memory.gather_attention, RETRIEVAL[name].sparse_decode

    def reference_spy(q, k, v, positions, valid):
        seen["reference"].append(read_sets(positions, valid))
        return gather(q, k, v, positions, valid)

    def optimized_spy(q, k, v, positions, counts, *args, **kwargs):
        within = torch.arange(positions.shape[-1], device=positions.device) < counts[..., None]
        seen["optimized"].append(read_sets(positions, within))
        return decode(q, k, v, positions, counts, *args, **kwargs)

    monkeypatch.setattr(sparse_memory, "gather_attention", reference_spy)
    monkeypatch.setattr(RETRIEVAL[name], "sparse_decode", optimized_spy)
    runs = decode_both(loaded, prompts_for(loaded, 2), lambda path: small_spec(name, path), steps=16)
    assert torch.equal(runs["reference"][0].tokens, runs["optimized"][0].tokens)
    assert seen["reference"] and seen["reference"] == seen["optimized"]
    shortest = min(len(p) for p in prompts_for(loaded, 2))
    assert max(len(slots) for call in seen["reference"] for row in call for slots in row) < shortest  # sparse


@pytest.mark.parametrize("path", ["reference", "optimized"])
@pytest.mark.parametrize("name", sorted(RETRIEVAL))
def test_a_budget_covering_the_history_is_full_kv(tiny_models, name, path):
    loaded = tiny_models["tiny-qwen3"]
    whole = dataclasses.replace(SMALL_CONFIGS[name], budget=4096)
    prompts = prompts_for(loaded, 2)
    retrieval, _ = decode(loaded, prompts, MethodSpec(name, path, whole), steps=16)
    full_kv, _ = decode(loaded, prompts, MethodSpec("full_kv", path), steps=16)
    assert torch.equal(retrieval.tokens, full_kv.tokens)
    for record in retrieval.steps:
        assert torch.equal(record.tokens_read, record.kv_lengths[None, :, None].expand_as(record.tokens_read))


@pytest.mark.parametrize("path", ["reference", "optimized"])
def test_tidaldecode_with_no_layer_left_to_select_in_reads_everything(tiny_models, path):
    """A model whose layers are all dense first layers (a shallow model at the default settings) has no
    selection layer: TidalDecode runs there as Full-KV instead of refusing the model."""
    loaded = tiny_models["tiny-llama"]
    config = dataclasses.replace(SMALL_CONFIGS["tidaldecode"], dense_layers=loaded.config.num_layers)
    trace, method = decode(loaded, prompts_for(loaded, 2), MethodSpec("tidaldecode", path, config), steps=8)
    assert method.selecting == []
    for record in trace.steps:
        assert torch.equal(record.tokens_read, record.kv_lengths[None, :, None].expand_as(record.tokens_read))
