"""sfibench's methods inside a transformers causal LM (the reference path): `apply` for a `with` block around
`model.generate` or the model's own forwards, `MethodCache` the per-generation cache it passes as the
forward's cache argument (`CACHE_ARGUMENT`: `cache` from transformers 5.24, `past_key_values` before), and
`TransformersDecoder` the model as the engine runs a Decoder (what `sfibench quality --engine transformers`
decodes). docs/transformers.md describes the use and the costs."""

from sfibench.hf.apply import CACHE_ARGUMENT, Applied, apply
from sfibench.hf.attention import UnsupportedModelError
from sfibench.hf.cache import MethodCache, UnsupportedGenerationError
from sfibench.hf.model import TransformersDecoder, engine_view

__all__ = ["CACHE_ARGUMENT", "Applied", "MethodCache", "TransformersDecoder", "UnsupportedGenerationError",
           "UnsupportedModelError", "apply", "engine_view"]
