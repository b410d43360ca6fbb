"""The attention function sfibench registers with transformers, and where each of its calls goes.

transformers 5 looks a model's attention up by name (`config._attn_implementation`) in its
`AttentionInterface`, and the mask that goes with it in its `AttentionMaskInterface`. sfibench.hf
registers one of each under `NAME`. Every model layer then hands its post-RoPE query and its new key and
value to `attention`, which passes them to the route of the forward being run: a `Route` set for the
length of one forward (a context variable, so nested or concurrent forwards keep their own).

- `EngineRoute`: the engine attends (prefill or a decode step through a method, engine/prefill.py and
  engine/driver.py), on the engine's own KV cache. Its attention masks by each sequence's own length,
  so the model builds no mask for it.
- `DenseRoute`: a forward made without an sfibench.hf cache (a scoring pass over whole texts): the
  model's own dense attention (SDPA, with SDPA's mask), as every method prefills.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from sfibench.core.errors import UsageError

NAME = "sfibench"
DENSE = "sdpa"  # what a forward without an sfibench.hf cache runs: the model's dense attention

_ROUTE: contextvars.ContextVar = contextvars.ContextVar("sfibench_hf_route", default=None)


class UnsupportedModelError(UsageError):
    """A model, or a use of it, that sfibench.hf cannot run a method on; the message names what is missing."""


class Route:
    builds_masks = False  # True: the model builds the masks of the dense implementation for this forward

    def attention(self, module, query, key, value, attention_mask, scaling, dropout, kwargs) -> torch.Tensor:
        """Attention output `[B, T, H_q, D]` of one layer."""
        raise NotImplementedError


class EngineRoute(Route):
    """Each layer's attention is `attend(layer, q, k, v)`, the engine's: q `[B, H_q, T, D]`, k and v the new
    `[B, H_kv, T, D]`, returning `[B, H_q, T, D]`.

    The engine's attention scales logits by 1/sqrt(head_dim); a layer with another scale (Gemma-3's
    query_pre_attn_scalar) has its query multiplied by `query_scale[layer]` first, as the engine's own
    Gemma-3 decoder does."""

    def __init__(self, attend, query_scale: tuple[float, ...]):
        self.attend, self.query_scale = attend, query_scale

    def attention(self, module, query, key, value, attention_mask, scaling, dropout, kwargs) -> torch.Tensor:
        layer = module.layer_idx
        scale = self.query_scale[layer]
        q = query * scale if scale != 1.0 else query
        return self.attend(layer, q, key, value).transpose(1, 2).contiguous()


class DenseRoute(Route):
    builds_masks = True

    def attention(self, module, query, key, value, attention_mask, scaling, dropout, kwargs) -> torch.Tensor:
        out, _ = ALL_ATTENTION_FUNCTIONS[DENSE](module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kwargs)
        return out


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The function registered as `NAME`: transformers calls it once per layer and forward."""
    route = _ROUTE.get()
    if route is None:
        raise UnsupportedModelError(
            f"{type(module).__name__} ran sfibench's attention outside the forward of the model sfibench.hf.apply "
            "was given (a submodule called on its own); call the model itself inside the `with` block")
    return route.attention(module, query, key, value, attention_mask, scaling, dropout, kwargs), None


def mask(*args, **kwargs):
    """The mask function registered as `NAME`: the dense implementation's mask where the forward is dense,
    none where the engine attends (it masks by each sequence's length)."""
    route = _ROUTE.get()
    if route is not None and route.builds_masks:
        return ALL_MASK_ATTENTION_FUNCTIONS[DENSE](*args, **kwargs)
    return None


def register() -> None:
    """Make `NAME` an attention implementation transformers can switch a model to (idempotent)."""
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, mask)


def enter(route: Route) -> contextvars.Token:
    """Send the attention of the forwards run from here on to `route`, until `leave` with the token returned."""
    return _ROUTE.set(route)


def leave(token: contextvars.Token) -> None:
    _ROUTE.reset(token)


@contextlib.contextmanager
def routed(route: Route):
    """Send the attention of the forwards run inside to `route`."""
    token = enter(route)
    try:
        yield
    finally:
        leave(token)
