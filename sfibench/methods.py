"""The attention-method protocol and the registry of (method, path) -> factory.

A method never owns the KV cache. After the prompt is prefilled it may look at the cache and at the
last prompt queries (its bootstrap); then, at each decode step, it decides whether each sequence takes
a slow step and returns the step's frozen plan (`plan`), which cached positions each query reads
(`attend`, which also records the tokens read), what happens after the step (`after_step`, SFI's
refresh), and it sees every emitted token (`observe`), which is how SFI's triggers work. The step
driver in engine/driver.py calls these in that order, eagerly or as a CUDA-graph replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sfibench.config import MethodSpec
from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.prefill import Prefilled
from sfibench.models.presets import ModelConfig
from sfibench.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class StepPlan:
    """The host-side facts one decode step's attention depends on: static sizes, and which kernels run.

    Frozen and hashable because it *is* the CUDA-graph key: a captured step is replayed only for an
    equal plan. Everything that changes from step to step without changing a size (lengths, which rows
    are slow, the current selection) is device data the method keeps in its own tensors, so a batch
    mixing slow and fast rows replays one graph. `graphable=False` asks the driver to run eagerly.
    """

    graphable: bool = True


class AttentionMethod:
    name = "abstract"
    has_slow_steps = False  # True: each step is reported as "slow", "bridge" or "fast" per sequence
    step_kind = "sparse"  # how steps are reported otherwise ("dense" for Full-KV)

    def __init__(self, spec: MethodSpec, model_config: ModelConfig, tokenizer: Tokenizer):
        self.spec = spec
        self.model_config = model_config
        self.tokenizer = tokenizer

    def start(self, cache: KVCache, prefilled: Prefilled) -> None:
        """A new batch was prefilled (or restored from a snapshot): reset per-sequence state."""

    def plan(self, ctx: StepContext) -> StepPlan:
        """Host side, before the step: decide each row's kind (`ctx.slow`), fill the method's device
        inputs for this step in place, and return the step's plan."""
        return StepPlan()

    def begin_step(self, ctx: StepContext, plan: StepPlan) -> None:
        """Device side, once per step before the first layer (captured with the step): derive the
        step's device tensors from `ctx.kv_lengths` and the method's state."""

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan: StepPlan) -> torch.Tensor:
        """Decode attention for layer `ctx.layer`; `ctx.tokens_read[ctx.layer]` must hold the tokens read
        once the step is done (here or in `begin_step`). Reads no host state outside `plan`."""
        raise NotImplementedError

    def after_step(self, ctx: StepContext, plan: StepPlan) -> None:
        """Host side, after the step was launched: where a slow step hands its evidence to the refresh."""

    def observe(self, tokens: torch.Tensor) -> None:
        """The tokens `[B]` emitted by the step just run."""

    def state(self, name: str, shape: tuple, dtype: torch.dtype, device, fill=0) -> torch.Tensor:
        """A per-batch state tensor set to `fill`, reused in place when the shape allows.

        A captured CUDA graph keeps reading the tensors it saw at capture, so state must be reset in
        place between runs rather than replaced by a new allocation.
        """
        tensor = getattr(self, name, None)
        if tensor is None or tensor.shape != torch.Size(shape) or tensor.dtype != dtype or tensor.device != device:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            setattr(self, name, tensor)
        return tensor.fill_(fill)

    def summary(self) -> dict:
        """Method-specific facts for reports (e.g. SFI's realised mean interval between slow steps)."""
        return {}


MethodFactory = Callable[[MethodSpec, ModelConfig, Tokenizer], AttentionMethod]
_REGISTRY: dict[tuple[str, str], MethodFactory] = {}


def register(name: str, path: str):
    def decorator(factory: MethodFactory) -> MethodFactory:
        _REGISTRY[(name, path)] = factory
        return factory

    return decorator


class UnknownMethodError(ValueError):
    pass


def available() -> list[tuple[str, str]]:
    _import_builtin_methods()
    return sorted(_REGISTRY)


def check_method(name: str, path: str) -> None:
    """Raise a helpful error unless (name, path) is registered; cheap, so call it before loading a model."""
    _import_builtin_methods()
    if (name, path) in _REGISTRY:
        return
    names = sorted({n for n, _ in _REGISTRY})
    if name not in names:
        raise UnknownMethodError(f"unknown method {name!r}; valid methods: {', '.join(names)}")
    paths = sorted(p for n, p in _REGISTRY if n == name)
    raise UnknownMethodError(f"method {name!r} has no {path!r} path; available: {', '.join(paths)}")


def create_method(spec: MethodSpec, model_config: ModelConfig, tokenizer: Tokenizer) -> AttentionMethod:
    check_method(spec.name, spec.path)
    return _REGISTRY[(spec.name, spec.path)](spec, model_config, tokenizer)


def _import_builtin_methods() -> None:
    # Importing the modules runs their @register decorators.
    import sfibench.baselines.full_kv
    import sfibench.baselines.snapkv
    import sfibench.baselines.streaming_llm
    import sfibench.optimized.full_kv
    import sfibench.optimized.sfi
    import sfibench.optimized.sparse_baselines
    import sfibench.reference.sfi  # noqa: F401
