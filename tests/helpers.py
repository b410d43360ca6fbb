"""Shared test helpers: a transformers model with the same weights as an sfibench Decoder; a quality run's
folder holding given sample records."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

from sfibench.models.presets import ModelConfig
from sfibench.reporting.results import SCHEMA_VERSION

HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def hf_twin(model) -> torch.nn.Module:
    """A transformers model of the same architecture holding the Decoder's weights."""
    cfg: ModelConfig = model.config
    config_cls, model_cls = (getattr(transformers, n) for n in HF_CLASSES[cfg.arch])
    rope = {"rope_type": "default", **(cfg.rope_scaling_dict() or {}), "rope_theta": cfg.rope_theta}
    hf_config = config_cls(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_context, tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters=rope, attention_bias=cfg.qkv_bias, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )
    if cfg.arch == "qwen3":
        hf_config.attention_bias = False
    twin = model_cls(hf_config).eval()
    result = twin.load_state_dict(model.state_dict(), strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert all("rotary" in k for k in result.missing_keys), result.missing_keys
    return twin.to(torch.float32)


def write_quality_run(directory: Path, samples: list[dict]) -> Path:
    """`directory` as a quality run's folder whose results.json holds `samples` and nothing else a reader
    of sample records needs."""
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps({
        "schema_version": SCHEMA_VERSION, "command": "quality", "config": {}, "provenance": {},
        "results": {"cells": []}, "samples": samples}))
    return directory
