"""Paths agree: every method with a reference and an optimized path gives the same result on both.

The optimized kernels run in Triton's interpreter here (float32, CPU), or compiled where CUDA is (float32,
every tensor on the GPU: test_kernels.DEVICE), so the two paths differ only in summation order: the
tokens each step reads must be identical, SFI's Selector must pick the same positions from the kernel's
evidence as from the reference's recomputed logits, and greedy decoding must emit the same tokens. On a
GPU in bf16 the committed check in reports/ (`paths_agree` in the H200 throughput run) measures selection
overlap and token agreement instead.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from method_matrix import METHOD_PATHS, SMALL_CONFIGS, small_spec
from test_kernels import DEVICE

from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.method import MethodSpec
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.models.loading import load_model
from sfibench.registry import create_method
from sfibench.sfi.config import SFIConfig, TriggerConfig

BOTH_PATHS = sorted({name for name, path in METHOD_PATHS if path == "optimized"}
                    & {name for name, path in METHOD_PATHS if path == "reference"})


def decode(loaded, prompts, spec, steps):
    """Greedy decoding of `prompts` with `spec` in float32 on DEVICE: (the trace, the method)."""
    cache = KVCache(loaded.config, len(prompts), max(map(len, prompts)) + steps, DEVICE, torch.float32)
    pre = prefill(loaded.model, cache, prompts, chunk=64)
    method = create_method(spec, loaded.config, loaded.tokenizer)
    return generate(loaded.model, cache, method, pre, steps, Sampler(SamplingConfig(), DEVICE)), method


def decode_both(loaded, prompts, spec_for, steps):
    return {path: decode(loaded, prompts, spec_for(path), steps) for path in ("reference", "optimized")}


def assert_same_selection(reference, optimized):
    """Every live (layer, row) selects the same positions, anchor and sink count on both paths."""
    a, b = reference.sel, optimized.sel
    assert torch.equal(a.published, b.published)
    for layer, row in a.published.nonzero().tolist() + (a.published == 0).nonzero().tolist():
        buffer = int(a.published[layer, row])
        count = int(a.counts[buffer, layer, row, 0])
        assert torch.equal(a.positions[buffer, layer, row, :, :count], b.positions[buffer, layer, row, :, :count])
        assert int(a.anchor[buffer, layer, row]) == int(b.anchor[buffer, layer, row])


@pytest.fixture(scope="module")
def tiny_models(tiny_models):
    """The session's tiny models, on DEVICE (the CPU ones themselves where that is the CPU)."""
    return tiny_models if DEVICE == "cpu" else {name: load_model(name, device=DEVICE) for name in tiny_models}


@pytest.fixture(scope="module")
def smollm2(smollm2):
    return smollm2 if DEVICE == "cpu" else load_model("smollm2-135m", device=DEVICE)


def prompts_for(loaded, batch):
    text = ("The keeper climbed the stairs. He lit the lamp! Was the sea calm? It was not. "
            "Ships passed in the night and the light turned slowly above them. ") * 2
    ids = loaded.tokenizer.encode(text)
    return [ids[: len(ids) - 17 * row] for row in range(batch)]


@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("name", BOTH_PATHS)
def test_paths_agree_on_tokens_and_reads(tiny_models, model_name, name):
    loaded = tiny_models[model_name]
    runs = decode_both(loaded, prompts_for(loaded, 2), lambda path: small_spec(name, path), steps=24)
    (ref, ref_method), (opt, opt_method) = runs["reference"], runs["optimized"]
    assert torch.equal(ref.tokens, opt.tokens)
    for a, b in zip(ref.steps, opt.steps):
        assert a.kinds == b.kinds
        assert torch.equal(a.tokens_read, b.tokens_read)
    if name == "sfi":
        assert any("slow" in step.kinds for step in ref.steps)  # refreshes happened and were compared
        assert_same_selection(ref_method, opt_method)


@pytest.fixture(scope="module")
def tiny_gemma3():
    return load_model("tiny-gemma3", device=DEVICE)


@pytest.mark.parametrize("name", BOTH_PATHS)
def test_paths_agree_with_sliding_window_layers(tiny_gemma3, name):
    """Gemma-3's local layers attend their window whatever the method; only the global layer selects. The
    prompts outgrow the 16-token window, so a local layer reads less than the whole history."""
    runs = decode_both(tiny_gemma3, prompts_for(tiny_gemma3, 2), lambda path: small_spec(name, path), steps=24)
    (ref, ref_method), (opt, opt_method) = runs["reference"], runs["optimized"]
    assert torch.equal(ref.tokens, opt.tokens)
    local = [layer for layer, is_global in enumerate(tiny_gemma3.config.layer_is_global) if not is_global]
    for a, b in zip(ref.steps, opt.steps):
        assert a.kinds == b.kinds
        assert torch.equal(a.tokens_read, b.tokens_read)
        assert int(a.tokens_read[local].max()) <= tiny_gemma3.config.sliding_window
    if name == "sfi":
        assert any("slow" in step.kinds for step in ref.steps)
        assert_same_selection(ref_method, opt_method)


def test_paths_agree_with_layer_groups(tiny_models):
    loaded = tiny_models["tiny-qwen3"]
    runs = decode_both(loaded, prompts_for(loaded, 1), lambda path: small_spec("sfi", path, layer_groups=2), steps=30)
    assert torch.equal(runs["reference"][0].tokens, runs["optimized"][0].tokens)
    assert_same_selection(runs["reference"][1], runs["optimized"][1])


def test_paths_agree_with_the_ablations_beyond_the_paper(tiny_models):
    """Evidence normalised over every visible key, neighbour-keeping top-K and bridge steps: the optimized
    path takes its evidence from the kernel's buffer over [0, L), the reference recomputes it."""
    loaded = tiny_models["tiny-qwen3"]

    def spec(path):
        selector = dataclasses.replace(SMALL_CONFIGS["sfi"].selector, evidence_norm="visible", keep_neighbours=3)
        return small_spec("sfi", path, selector=selector, bridge_steps=2)

    runs = decode_both(loaded, prompts_for(loaded, 2), spec, steps=24)
    (ref, ref_method), (opt, opt_method) = runs["reference"], runs["optimized"]
    assert torch.equal(ref.tokens, opt.tokens)
    assert all(torch.equal(a.tokens_read, b.tokens_read) for a, b in zip(ref.steps, opt.steps))
    assert_same_selection(ref_method, opt_method)


def test_paths_agree_on_smollm2(smollm2):
    """The real model: 30 layers, 3 KV heads (so cross-head exclusivity runs), a few hundred tokens."""
    ids = smollm2.tokenizer.encode("The lighthouse keeper wrote in his log every night. " * 40)[:600]

    def spec(path):
        sfi = SFIConfig(k_head=96, n_recent=64, trigger=TriggerConfig(t_max=8, min_gap=4))
        return MethodSpec("sfi", path, sfi)

    runs = decode_both(smollm2, [ids], spec, steps=16)
    assert torch.equal(runs["reference"][0].tokens, runs["optimized"][0].tokens)
    assert_same_selection(runs["reference"][1], runs["optimized"][1])


def test_when_ready_is_refused_on_the_reference_path(tiny_models):
    loaded = tiny_models["tiny-llama"]
    spec = small_spec("sfi", "reference", publish="when_ready")
    with pytest.raises(ValueError, match="optimized"):
        create_method(spec, loaded.config, loaded.tokenizer)
