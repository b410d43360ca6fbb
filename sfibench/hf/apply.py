"""`apply`: run a registered method inside a loaded transformers causal LM, for the length of a `with` block.

    with sfibench.hf.apply(model, tokenizer, method=name, budget="15%"):  # name: a registered method
        output = model.generate(**inputs, max_new_tokens=64)

Entering switches the model's attention implementation to sfibench's (attention.py), reads the model's
attention shape (model.py: what cannot run is refused here), and hooks the model's forward: before it,
the forward's route is chosen from the cache it is given (a `MethodCache`: the method's prefill or
decode step; none, or an empty one: the model's own dense attention, as every method prefills; any
other cache holding tokens: refused, its decode would bypass the method); after it, the cache finishes
the step. `model.generate` gets a fresh `MethodCache` per call unless one is passed, sized for the
call's new tokens. Leaving removes the hooks and the `generate` wrapper and switches the attention
implementation back, so the model is exactly as it was.
"""

from __future__ import annotations

import inspect
from typing import Self

from transformers.cache_utils import Cache
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from sfibench import registry
from sfibench.core.budget import Budget
from sfibench.core.errors import UsageError
from sfibench.engine.method import AttentionMethod, MethodConfig
from sfibench.hf.attention import DenseRoute, enter, leave
from sfibench.hf.cache import MethodCache, UnsupportedGenerationError
from sfibench.hf.model import Described, describe, switch_attention
from sfibench.models.tokenizer import Tokenizer

PATH = "reference"  # the path sfibench.hf runs: plain PyTorch, any device (for speed, the engine)
# The name transformers' forwards and `generate` give their cache argument in the installed release, read
# from a forward's signature: `cache` from 5.24 on (`past_key_values` still taken there, with a deprecation
# warning), `past_key_values` before.
CACHE_ARGUMENT = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters \
    else "past_key_values"


class Applied:
    """A method applied to a model while the `with` block lasts; `last_cache` is the latest generation's cache,
    a `generate` call's or the last one `cache()` made for a loop of your own (its `steps` say what each decode
    step read, `summary()` the method's own facts)."""

    def __init__(self, model, tokenizer, method: str, budget: int | str | None = None,
                 config: MethodConfig | None = None, evidence_rows: int = 64):
        self.model = model
        self.tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
        self.method_name, self.config = method, config if config is not None else registry.default_config(method)
        self.budget = None if budget is None else Budget.parse(str(budget), "budget")
        self.evidence_rows = evidence_rows
        self.described: Described | None = None
        self.last_cache: MethodCache | None = None
        self._undo: list = []
        self._routes: list = []

    # --- the block -----------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        model = self.model
        previous = switch_attention(model)
        self._undo.append(lambda: model.set_attn_implementation(previous))
        try:
            self.described = describe(model)
            self._hook()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _hook(self) -> None:
        model = self.model
        handles = [model.register_forward_pre_hook(self._before, with_kwargs=True),
                   model.register_forward_hook(self._after, with_kwargs=True, always_call=True)]
        self._undo.append(lambda: [handle.remove() for handle in handles])
        own = "generate" in model.__dict__  # an instance attribute someone set before: put it back as it was
        earlier, generate = model.__dict__.get("generate"), model.generate

        def with_cache(*args, **kwargs):
            given = given_cache(kwargs)
            if given is None:
                kwargs[CACHE_ARGUMENT] = given = self.cache(self._new_tokens(args, kwargs))
            self.last_cache = given
            return generate(*args, **kwargs)

        model.generate = with_cache
        self._undo.append(lambda: setattr(model, "generate", earlier) if own else delattr(model, "generate"))

    # --- caches and methods --------------------------------------------------------------------------
    def cache(self, max_new_tokens: int) -> MethodCache:
        """A new cache (one per generation) with room for `max_new_tokens` tokens after the longest prompt."""
        if self.described is None:
            raise UnsupportedGenerationError("make a cache inside the `with sfibench.hf.apply(...)` block")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise UsageError(f"max_new_tokens {max_new_tokens!r} is not a whole number >= 1; give the tokens the "
                             "generation adds, such as 64")
        self.last_cache = MethodCache(self.described, self.new_method, max_new_tokens, self.evidence_rows)
        return self.last_cache

    def new_method(self, context: int) -> AttentionMethod:
        """The method for a batch whose longest prompt has `context` tokens (a percentage budget's context)."""
        config = self.config
        if self.budget is not None:
            config = registry.at_budget(self.method_name, PATH, self.budget.resolve(context, "budget"),
                                        config).config
        spec = registry.spec(self.method_name, PATH, config)
        return registry.create_method(spec, self.described.config, self.tokenizer)

    def _new_tokens(self, args, kwargs) -> int:
        """The new tokens `generate` will make, as it reads its arguments and generation config."""
        config = kwargs.get("generation_config") or self.model.generation_config
        new = kwargs.get("max_new_tokens", config.max_new_tokens)
        if new is None:
            prompt = kwargs.get("input_ids", args[0] if args else kwargs.get("inputs_embeds"))
            new = kwargs.get("max_length", config.max_length) - prompt.shape[1]
        return new

    # --- the forward hooks ---------------------------------------------------------------------------
    def _before(self, module, args, kwargs):
        try:
            route, cache = self._route(args, kwargs)
        except BaseException:
            self._routes.append((None, None))  # the forward hook still runs (always_call), and pops this
            raise
        self._routes.append((enter(route), cache))

    def _route(self, args, kwargs):
        cache = given_cache(kwargs)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        reference = input_ids if input_ids is not None else kwargs.get("inputs_embeds")
        if isinstance(cache, MethodCache):
            return cache.open_forward(input_ids, kwargs.get("attention_mask"), reference.shape[1], reference), cache
        if cache is not None and cache.get_seq_length() > 0:
            raise UnsupportedGenerationError(
                f"this forward continues a {type(cache).__name__} holding {cache.get_seq_length()} tokens, which "
                "sfibench.hf did not make: its decode would bypass the method. Inside sfibench.hf.apply call "
                f"model.generate, or pass the block's .cache(max_new_tokens) as {CACHE_ARGUMENT}")
        return DenseRoute(), None

    def _after(self, module, args, kwargs, output):
        token, cache = self._routes.pop()
        if token is not None:
            leave(token)
        if cache is not None and output is not None:
            cache.close_forward(output.logits)


def given_cache(kwargs: dict) -> Cache | None:
    """The cache a call was given as `CACHE_ARGUMENT` or as `past_key_values`. A cache under `cache` where the
    release has no such argument is refused: the model would ignore it and attend densely."""
    if CACHE_ARGUMENT != "cache" and isinstance(kwargs.get("cache"), Cache):
        raise UsageError("cache= is not an argument of this transformers release's forwards; pass the cache as "
                         "past_key_values=")
    given = (kwargs.get(name) for name in (CACHE_ARGUMENT, "past_key_values"))
    return next((cache for cache in given if isinstance(cache, Cache)), None)


def apply(model, tokenizer, method: str, budget: int | str | None = None, config: MethodConfig | None = None,
          evidence_rows: int = 64) -> Applied:
    """Method `method` (a name registry.names() lists) on its reference path, applied to `model` inside a `with`
    block. `budget`: tokens read per (layer, KV head), as a count (300) or a share of the longest prompt
    ("15%"), turned into the method's settings by its own budget rule; None keeps `config` (default: the
    method's defaults). `evidence_rows`: the last prompt queries kept for the methods that score the prompt
    with them (SnapKV's window, SFI's bootstrap), as the engine keeps them."""
    check_arguments(model, tokenizer, method, budget, evidence_rows)
    registry.check_method(method, PATH)
    settings = registry.get(method).config
    if config is not None and not isinstance(config, settings):
        raise UsageError(f"config is a {type(config).__name__}; method {method!r} takes its own settings, a "
                         f"{settings.__name__}")
    return Applied(model, tokenizer, method, budget, config, evidence_rows)


def check_arguments(model, tokenizer, method, budget, evidence_rows) -> None:
    """What `apply` is given, checked before anything of the model is touched; each refusal is a UsageError
    naming the argument and the fix, as the CLI's are."""
    if model is None:  # any other model that is not a transformers causal LM is refused when it is described
        raise UsageError("model is None; give a transformers causal LM, such as AutoModelForCausalLM.from_pretrained"
                         "(...)")
    backend = tokenizer.backend if isinstance(tokenizer, Tokenizer) else tokenizer
    missing = [name for name in ("encode", "decode") if not callable(getattr(backend, name, None))]
    if missing:
        raise UsageError(f"tokenizer is a {type(backend).__name__} without {' or '.join(missing)}; give the model's "
                         "tokenizer, such as AutoTokenizer.from_pretrained(...) (the methods read its punctuation)")
    if not isinstance(method, str):
        raise UsageError(f"method is a {type(method).__name__}; give a method's name, one of "
                         f"{', '.join(registry.names())}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, str))):
        raise UsageError(f"budget {budget!r} is not a token count or a percentage; give one such as 300 or '15%'")
    if isinstance(evidence_rows, bool) or not isinstance(evidence_rows, int) or not 1 <= evidence_rows <= 2**31 - 1:
        raise UsageError(f"evidence_rows {evidence_rows!r} is not a whole number >= 1; give the number of last "
                         "prompt queries the prompt-scoring methods keep, such as 64")

