"""Compact caches (engine/compact.py): StreamingLLM and SnapKV on their optimized path keep only what they
read of each prompt, and decode the same tokens, reading as many, as their reference path does over the
whole cache with masks and gathers.

Greedy float32 decoding on the CPU, the kernels in Triton's interpreter. One prompt outgrows the budget (the
method drops most of it), the other is shorter than the budget (kept whole).
"""

from __future__ import annotations

import pytest
import torch
from method_matrix import small_spec

from sfibench.engine.cache import KVCache
from sfibench.engine.compact import compact_prefill, compact_slots
from sfibench.engine.decode import generate
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.models.presets import get_preset
from sfibench.registry import create_method, get

STEPS = 20
COMPACT_METHODS = ("streaming_llm", "snapkv")


def prompts_for(tokenizer) -> list[list[int]]:
    text = ("The keeper climbed the stairs. He lit the lamp! Was the sea calm? It was not. "
            "Ships passed in the night and the light turned slowly above them. ") * 2
    ids = tokenizer.encode(text)
    return [ids, ids[:30]]  # the small settings' budget is 36 tokens


def whole_cache_run(loaded, prompts, spec):
    cache = KVCache(loaded.config, len(prompts), max(map(len, prompts)) + STEPS, "cpu", torch.float32)
    snapshot = prefill(loaded.model, cache, prompts, chunk=64)
    method = create_method(spec, loaded.config, loaded.tokenizer)
    return generate(loaded.model, cache, method, snapshot, STEPS, Sampler(SamplingConfig(), "cpu"))


def compact_run(loaded, prompts, spec):
    method = create_method(spec, loaded.config, loaded.tokenizer)
    slots = compact_slots(spec.config, spec.path, loaded.config, max(map(len, prompts)) + STEPS, STEPS)

    def fill(prompt_cache, row):
        return prefill(loaded.model, prompt_cache, [prompts[row]], chunk=64)

    cache, snapshot = compact_prefill(method, slots, [len(p) for p in prompts], "cpu", torch.float32, fill)
    return cache, generate(loaded.model, cache, method, snapshot, STEPS, Sampler(SamplingConfig(), "cpu"))


@pytest.mark.parametrize("name", COMPACT_METHODS)
def test_the_compact_cache_decodes_what_the_masked_whole_cache_does(tiny_models, name):
    loaded = tiny_models["tiny-qwen3"]
    prompts = prompts_for(loaded.tokenizer)
    masked = whole_cache_run(loaded, prompts, small_spec(name, "reference"))
    cache, compact = compact_run(loaded, prompts, small_spec(name, "optimized"))
    budget = small_spec(name, "optimized").config.budget
    assert cache.max_seq == budget + STEPS < len(prompts[0])  # the budget and the tokens to generate, no more
    # the long prompt kept its budget and then grew by a slot per step; the short one was kept whole
    grown = cache.lengths_host - torch.tensor([budget, len(prompts[1])])
    assert grown[0] == grown[1] >= STEPS - 1  # (the first token comes from the prefill's logits)
    assert int(cache.position_offset[0]) == len(prompts[0]) - budget and int(cache.position_offset[1]) == 0
    assert torch.equal(masked.tokens, compact.tokens)
    for a, b in zip(masked.steps, compact.steps):
        assert torch.equal(a.tokens_read, b.tokens_read)


def test_methods_that_may_read_any_position_and_sliding_layers_keep_the_whole_cache():
    """Only a method whose settings declare compact_slots on a path gets a compact cache, and never on a model
    whose local layers read the last slots as their window."""
    qwen, gemma = get_preset("tiny-qwen3"), get_preset("tiny-gemma3")
    for name in ("full_kv", "sfi", "quest", "tidaldecode", *COMPACT_METHODS):
        config = get(name).config()
        assert compact_slots(config, "reference", qwen, 100, 10) is None
        assert compact_slots(config, "optimized", gemma, 100, 10) is None
        compact = compact_slots(config, "optimized", qwen, 10_000, 10)
        assert compact == (config.budget + 10 if name in COMPACT_METHODS else None)
