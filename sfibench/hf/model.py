"""A transformers causal LM as the engine sees a model: its attention shape as a ModelConfig, and a
stand-in for the engine's Decoder that runs the transformers layers with the engine's attention.

The shape is read from the model itself, not from its config's names (which differ by architecture): one
token runs through the model with a recording route, and each layer's call to the attention interface
shows its query, key and value heads, head width, logit scale and sliding window, exactly as the model
passes them. The same call shows what the engine's attention cannot do (logit soft-capping, learned
sinks, bidirectional layers, value heads of another width), which is refused here, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sfibench.hf.attention import NAME, EngineRoute, Route, UnsupportedModelError, register, routed
from sfibench.models.presets import ModelConfig


@dataclass(frozen=True)
class LayerCall:
    """What one layer passed to the attention interface."""

    query_heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    dtype: torch.dtype
    scaling: float | None
    sliding_window: int | None
    unsupported: tuple[str, ...]  # what of it the engine's attention cannot compute


class _Probe(Route):
    def __init__(self):
        self.calls: dict[int, LayerCall] = {}

    def attention(self, module, query, key, value, attention_mask, scaling, dropout, kwargs) -> torch.Tensor:
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise UnsupportedModelError(f"{type(module).__name__} calls the attention interface without a layer_idx, "
                                        "so sfibench.hf cannot tell its layers apart")
        unsupported = []
        if kwargs.get("softcap") is not None:
            unsupported.append(f"attention logit soft-capping (softcap={kwargs['softcap']})")
        if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
            unsupported.append("learned attention sinks (s_aux)")
        if not getattr(module, "is_causal", True):
            unsupported.append("bidirectional attention (is_causal=False)")
        if dropout:
            unsupported.append(f"attention dropout {dropout} (the model is in training mode: call model.eval())")
        self.calls[layer] = LayerCall(query.shape[1], key.shape[1], query.shape[-1], value.shape[-1], key.dtype,
                                      scaling, kwargs.get("sliding_window") or None, tuple(unsupported))
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])


@dataclass(frozen=True)
class Described:
    config: ModelConfig  # what the methods and the engine's cache are built for
    query_scale: tuple[float, ...]  # per layer: q is multiplied by this so that 1/sqrt(head_dim) is its logit scale
    dtype: torch.dtype  # of the keys and values: the engine's cache holds them in it


def switch_attention(model) -> str:
    """Make `NAME` the model's attention implementation; returns the one it had."""
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise UnsupportedModelError(f"{type(model).__name__} is not a transformers model (no set_attn_implementation); "
                                    "sfibench.hf applies to transformers causal LMs")
    register()
    previous = model.config._attn_implementation
    if previous == NAME:
        raise UnsupportedModelError(f"sfibench's attention already runs in this {type(model).__name__}: apply one "
                                    "method at a time (one sfibench.hf.apply block)")
    model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:
        raise UnsupportedModelError(f"{type(model).__name__} does not route its attention through transformers' "
                                    "AttentionInterface, so sfibench.hf cannot replace it")
    return previous


@torch.no_grad()
def describe(model) -> Described:
    """The model's attention shape, from one token run through it (its attention already switched to `NAME`)."""
    probe = _Probe()
    name = type(model).__name__
    device = next(model.parameters()).device
    try:
        with routed(probe):
            logits = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False).logits
    except (TypeError, ValueError, AttributeError) as error:
        raise UnsupportedModelError(f"{name} did not run one token as a causal LM ({error}); sfibench.hf applies to "
                                    "decoder-only causal LMs") from None
    calls = probe.calls
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(text, "num_hidden_layers", None) or (max(calls) + 1 if calls else 0)
    missing = sorted(set(range(layers)) - set(calls))
    if not calls or missing:
        raise UnsupportedModelError(f"{name}: layers {missing or list(range(layers))} do not call transformers' "
                                    "attention interface (recurrent, convolutional or custom layers), so no method can "
                                    "run in them")
    for layer, call in sorted(calls.items()):
        if call.unsupported:
            raise UnsupportedModelError(f"{name} layer {layer} uses {', '.join(call.unsupported)}, which sfibench's "
                                        "methods do not compute (they attend with a plain softmax over cached keys)")
    first = calls[0]
    shape = (first.query_heads, first.kv_heads, first.head_dim)
    for layer, call in sorted(calls.items()):
        if (call.query_heads, call.kv_heads, call.head_dim) != shape:
            raise UnsupportedModelError(
                f"{name}: layer {layer} has {call.query_heads} query / {call.kv_heads} KV heads of width "
                f"{call.head_dim}, layer 0 {shape[0]} / {shape[1]} of width {shape[2]}; the engine's cache needs one "
                "shape for every layer")
        if call.value_dim != call.head_dim:
            raise UnsupportedModelError(f"{name}: value heads of width {call.value_dim} differ from query/key heads of "
                                        f"width {call.head_dim}; the engine's cache holds one width")
    if shape[0] % shape[1]:
        raise UnsupportedModelError(f"{name}: {shape[0]} query heads do not share {shape[1]} KV heads evenly")
    windows = sorted({call.sliding_window for call in calls.values() if call.sliding_window})
    if len(windows) > 1:
        raise UnsupportedModelError(f"{name}: its layers slide windows of {windows} tokens; the engine runs one "
                                    "sliding window per model")
    sliding = [bool(calls[layer].sliding_window) for layer in range(layers)]
    config = ModelConfig(
        name=str(getattr(text, "name_or_path", "") or text.model_type), arch=str(text.model_type),
        vocab_size=logits.shape[-1], hidden_size=int(getattr(text, "hidden_size", 0) or 0),
        intermediate_size=int(getattr(text, "intermediate_size", 0) or 0), num_layers=layers, num_heads=shape[0],
        num_kv_heads=shape[1], head_dim=shape[2], max_context=int(getattr(text, "max_position_embeddings", 0) or 0),
        sliding_window=windows[0] if windows else 0,
        layer_is_global=tuple(not s for s in sliding) if any(sliding) else (), source="hf")
    scale = tuple(1.0 if calls[layer].scaling is None else calls[layer].scaling * shape[2] ** 0.5
                  for layer in range(layers))
    return Described(config, scale, first.dtype)


class TransformersDecoder:
    """A transformers causal LM run as the engine runs its Decoder: `model(tokens, positions, attend)` returns
    logits, and every layer's attention is `attend(layer, q, k, v)`, so the engine's prefill and step driver
    (and the quality harness on top of them) run it unchanged. Its attention must already be `NAME`."""

    def __init__(self, model, described: Described):
        self.hf, self.config, self.query_scale = model, described.config, described.query_scale

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, attend, last_only: bool = False) -> torch.Tensor:
        with routed(EngineRoute(attend, self.query_scale)):
            out = self.hf(input_ids=tokens, position_ids=positions, use_cache=False,
                          logits_to_keep=1 if last_only else 0)
        return out.logits

    def parameters(self):
        return self.hf.parameters()


def engine_view(model) -> TransformersDecoder:
    """The model as the engine's Decoder, for good: its attention implementation stays `NAME` (a model loaded for
    the engine to run, as `sfibench quality --engine transformers` does)."""
    switch_attention(model)
    return TransformersDecoder(model, describe(model))
