"""Shared by the sfibench.hf tests: the same prompts through the engine and through a transformers model."""

from __future__ import annotations

import torch

import sfibench.hf
from sfibench import registry
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import Trace, generate
from sfibench.engine.method import MethodSpec
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig


def left_padded(prompts: list[list[int]], pad_id: int = 0) -> dict:
    """`generate`'s inputs for prompts of different lengths: padded on the left, as transformers decodes."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return {"input_ids": ids, "attention_mask": mask}


def engine_trace(loaded, spec: MethodSpec, prompts: list[list[int]], new_tokens: int,
                 forced: torch.Tensor | None = None) -> Trace:
    """The engine's greedy (or teacher-forced) decode of `prompts` under `spec`, no end-of-sequence stop.
    `loaded.model` is the engine's Decoder, or a transformers model as one (sfibench.hf.TransformersDecoder)."""
    cache = KVCache(loaded.config, len(prompts), max(map(len, prompts)) + new_tokens, "cpu", torch.float32)
    prefilled = prefill(loaded.model, cache, prompts)
    method = registry.create_method(spec, loaded.config, loaded.tokenizer)
    return generate(loaded.model, cache, method, prefilled, new_tokens, Sampler(SamplingConfig(), "cpu"),
                    forced=forced)


def hf_generate(model, tokenizer, spec: MethodSpec, prompts: list[list[int]], new_tokens: int, **options):
    """`model.generate` inside sfibench.hf.apply: the new tokens `[B, new_tokens]` and the generation's cache.
    The models here name no end-of-sequence token, so every row makes all `new_tokens`, as in the engine."""
    inputs = left_padded(prompts)
    with sfibench.hf.apply(model, tokenizer, spec.name, config=spec.config) as applied:
        out = model.generate(**inputs, max_new_tokens=new_tokens, pad_token_id=0, **{"do_sample": False, **options})
    return out[:, inputs["input_ids"].shape[1]:], applied.last_cache


def assert_same_steps(trace: Trace, tokens: torch.Tensor, cache) -> None:
    """The same tokens, and at every decode step the same kind and tokens read per (layer, row, KV head)."""
    assert tokens.tolist() == trace.tokens.tolist()
    assert len(cache.steps) == len(trace.steps) == tokens.shape[1] - 1
    for index, (ours, theirs) in enumerate(zip(cache.steps, trace.steps)):
        assert ours.kinds == theirs.kinds, index
        assert torch.equal(ours.tokens_read, theirs.tokens_read), index
