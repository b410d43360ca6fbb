"""The sfibench decoder and engine against transformers' own implementation of the same weights."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import hf_twin

from sfibench import registry
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.driver import StepDriver
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.models.decoder import Decoder
from sfibench.models.loading import _place, load_model
from sfibench.models.presets import get_preset, rope_scaling_tuple
from sfibench.engine.prefill import causal_prefill_attention
from sfibench.registry import create_method

DENSE = registry.spec(registry.dense().name)  # the method every other one is compared with

TINY = ["tiny-llama", "tiny-qwen2", "tiny-qwen3"]


def full_logits(model, tokens):
    positions = torch.arange(tokens.shape[1])[None]
    with torch.no_grad():
        return model(tokens, positions, lambda layer, q, k, v: causal_prefill_attention(q, k, v, 0))


def engine_logits(loaded, prompt: list[int], forced: list[int], chunk: int = 2048):
    """Logits after the prompt, then after each teacher-forced decode step."""
    cache = KVCache(loaded.config, 1, len(prompt) + len(forced) + 1, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [prompt], chunk=chunk)
    driver = StepDriver(loaded.model, cache, create_method(DENSE, loaded.config, loaded.tokenizer))
    driver.start(pre)
    out = [pre.last_logits[0]]
    for token in forced:
        out.append(driver.step(torch.tensor([token])).logits[0])
    return torch.stack(out)


@pytest.mark.parametrize("name", TINY)
def test_prefill_and_decode_logits_match_transformers(tiny_models, name):
    loaded = tiny_models[name]
    twin = hf_twin(loaded.model)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 256, (40,), generator=gen).tolist()
    forced = torch.randint(0, 256, (32,), generator=gen).tolist()
    with torch.no_grad():
        expected = twin(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:]
    ours_full = full_logits(loaded.model, torch.tensor([prompt + forced]))[0, len(prompt) - 1:]
    ours_engine = engine_logits(loaded, prompt, forced, chunk=16)  # chunked prefill on purpose
    assert (ours_full - expected).abs().max() < 1e-4
    assert (ours_engine - expected).abs().max() < 1e-4


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
])
def test_rope_scaling_matches_transformers(tiny_models, scaling):
    base = tiny_models["tiny-qwen3"].model
    cfg = replace(base.config, rope_scaling=rope_scaling_tuple(scaling), max_context=64)
    scaled = Decoder(cfg)
    scaled.load_state_dict(base.state_dict())
    scaled = _place(scaled, "cpu", torch.float32)
    tokens = torch.randint(0, 256, (1, 60), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf_twin(scaled)(tokens).logits
    ours = full_logits(scaled, tokens)
    assert (ours - expected).abs().max() < 1e-4
    # the scaling really changed the model (otherwise this test would prove nothing)
    assert (ours - full_logits(base, tokens)).abs().max() > 1e-3


@pytest.mark.parametrize("name", TINY)
def test_greedy_generation_is_token_identical_to_transformers(tiny_models, name):
    loaded = tiny_models[name]
    twin = hf_twin(loaded.model)
    prompt = loaded.tokenizer.encode("The lighthouse keeper climbed the stairs.")
    with torch.no_grad():
        expected = twin.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                                 min_new_tokens=32)[0, len(prompt):]
    cache = KVCache(loaded.config, 1, 128, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [prompt])
    method = create_method(DENSE, loaded.config, loaded.tokenizer)
    trace = generate(loaded.model, cache, method, pre, 32, Sampler(SamplingConfig(), "cpu"))
    assert trace.tokens[0].tolist() == expected.tolist()


def test_hf_checkpoint_directory_round_trip(tmp_path, tiny_models):
    loaded = tiny_models["tiny-qwen2"]
    hf_twin(loaded.model).save_pretrained(tmp_path)
    reloaded = load_model(str(tmp_path))
    assert reloaded.config.arch == "qwen2" and reloaded.config.qkv_bias
    tokens = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(full_logits(reloaded.model, tokens), full_logits(loaded.model, tokens), atol=1e-5)


@pytest.mark.slow
def test_smollm2_logits_and_greedy_tokens_match_transformers(smollm2):
    twin = hf_twin(smollm2.model)
    prompt = smollm2.tokenizer.encode("The history of lighthouses begins with fires lit on hills. Later,", )
    with torch.no_grad():
        expected_tokens = twin.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                                        min_new_tokens=32)[0, len(prompt):].tolist()
        expected_logits = twin(torch.tensor([prompt + expected_tokens])).logits[0, len(prompt) - 1:]
    ours = engine_logits(smollm2, prompt, expected_tokens, chunk=8)
    assert (ours - expected_logits).abs().max() < 1e-3

    cache = KVCache(smollm2.config, 1, 256, "cpu", torch.float32)
    pre = prefill(smollm2.model, cache, [prompt])
    method = create_method(DENSE, smollm2.config, smollm2.tokenizer)
    trace = generate(smollm2.model, cache, method, pre, 32, Sampler(SamplingConfig(), "cpu"))
    assert trace.tokens[0].tolist() == expected_tokens


def test_smollm2_preset_shape_matches_the_gguf(smollm2):
    loaded, preset = smollm2.config.to_dict(), get_preset("smollm2-135m").to_dict()
    assert loaded.pop("rms_norm_eps") == pytest.approx(preset.pop("rms_norm_eps"), rel=1e-6)  # stored as f32
    loaded.pop("name"), preset.pop("name")
    assert loaded == preset
