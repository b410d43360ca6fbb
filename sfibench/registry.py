"""The one list of decoding methods. Adding a method is one module in baselines/ and one line in MODULES.

Runners, quality conditions, the bytes model, the memory estimate and the CLI ask this module and the
method's `MethodDef` / `MethodConfig` (engine/method.py); none of them names a method. A method's module
loads when the method is first asked for (each imports torch), so the command line checks its names
(`names`, `check_name`) before torch is imported.
"""

from __future__ import annotations

import functools
import importlib

from sfibench.core.errors import UsageError
from sfibench.engine.method import AttentionMethod, MethodConfig, MethodDef, MethodSpec
from sfibench.sfi import config as sfi

# name -> the module whose METHOD it is, in the order tables list them (tests hold each name to its METHOD)
MODULES = {
    "full_kv": "sfibench.baselines.full_kv",
    sfi.METHOD.name: sfi.__name__,
    "streaming_llm": "sfibench.baselines.streaming_llm",
    "snapkv": "sfibench.baselines.snapkv",
    "quest": "sfibench.baselines.quest",
    "tidaldecode": "sfibench.baselines.tidaldecode",
}

# Every sparse method is compared at the tokens this method reads per (layer, KV head) (SPEC 6).
BUDGET_REFERENCE = sfi.METHOD.name
PATHS = ("reference", "optimized")


class UnknownMethodError(UsageError):
    pass


def names() -> list[str]:
    return list(MODULES)


def check_name(name: str) -> None:
    """Raise a helpful error unless a method is registered as `name`; loads no method module."""
    if name not in MODULES:
        raise UnknownMethodError(f"unknown method {name!r}; valid methods: {', '.join(sorted(names()))}")


def get(name: str) -> MethodDef:
    check_name(name)
    return importlib.import_module(MODULES[name]).METHOD


@functools.cache
def methods() -> tuple[MethodDef, ...]:
    """Every method's MethodDef (loading every method module)."""
    return tuple(get(name) for name in MODULES)


def __getattr__(attribute: str):
    # METHODS: the registered MethodDefs, loaded on first use (each module imports torch)
    if attribute == "METHODS":
        return methods()
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def dense() -> MethodDef:
    """The method every speedup is measured against (it reads every cached token)."""
    return next(m for m in methods() if m.dense)


def available() -> list[tuple[str, str]]:
    return sorted((m.name, path) for m in methods() for path in m.paths)


def check_method(name: str, path: str) -> None:
    """Raise a helpful error unless (name, path) exists (loads the method's module, not a model)."""
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
