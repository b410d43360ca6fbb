"""The one list of decoding methods. Adding a method is one module in baselines/ and one line in METHODS.

Runners, quality conditions, the bytes model, the memory estimate and the CLI ask this module and the
method's `MethodDef` / `MethodConfig` (engine/method.py); none of them names a method.
"""

from __future__ import annotations

from sfibench.baselines import full_kv, quest, snapkv, streaming_llm, tidaldecode
from sfibench.core.errors import UsageError
from sfibench.engine.method import AttentionMethod, MethodConfig, MethodDef, MethodSpec
from sfibench.sfi import config as sfi

METHODS: tuple[MethodDef, ...] = (
    full_kv.METHOD,
    sfi.METHOD,
    streaming_llm.METHOD,
    snapkv.METHOD,
    quest.METHOD,
    tidaldecode.METHOD,
)

# Every sparse method is compared at the tokens this method reads per (layer, KV head) (SPEC 6).
BUDGET_REFERENCE = sfi.METHOD.name
PATHS = ("reference", "optimized")


class UnknownMethodError(UsageError):
    pass


def names() -> list[str]:
    return [m.name for m in METHODS]


def get(name: str) -> MethodDef:
    for method in METHODS:
        if method.name == name:
            return method
    raise UnknownMethodError(f"unknown method {name!r}; valid methods: {', '.join(sorted(names()))}")


def dense() -> MethodDef:
    """The method every speedup is measured against (it reads every cached token)."""
    return next(m for m in METHODS if m.dense)


def available() -> list[tuple[str, str]]:
    return sorted((m.name, path) for m in METHODS for path in m.paths)


def check_method(name: str, path: str) -> None:
    """Raise a helpful error unless (name, path) exists; cheap, so call it before loading a model."""
    method = get(name)
    if path not in method.paths:
        raise UnknownMethodError(f"method {name!r} has no {path!r} path; available: {', '.join(sorted(method.paths))}")


def default_config(name: str) -> MethodConfig:
    return get(name).config()


def spec(name: str, path: str = "reference", config: MethodConfig | None = None) -> MethodSpec:
    """A checked MethodSpec with the method's default settings unless `config` is given."""
    check_method(name, path)
    return MethodSpec(name, path, default_config(name) if config is None else config)


def at_budget(name: str, path: str, budget: int, config: MethodConfig | None = None) -> MethodSpec:
    """Method `name` reading `budget` tokens per (layer, KV head), by its own budget rule."""
    base = spec(name, path, config)
    return MethodSpec(name, path, base.config.with_budget(budget))


def create_method(spec: MethodSpec, model_config, tokenizer) -> AttentionMethod:
    check_method(spec.name, spec.path)
    config = spec.config if spec.config is not None else default_config(spec.name)
    return get(spec.name).path_class(spec.path)(config, model_config, tokenizer)
