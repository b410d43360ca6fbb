"""The parametrized method matrix every method test runs: each registered method at small settings.

Budgets sit far below the test contexts, so every sparse method really drops tokens. Adding a method
adds one row to SMALL_CONFIGS (tests/support/test_layout.py fails until every registered method has one).
"""

from __future__ import annotations

import dataclasses

from sfibench import registry
from sfibench.baselines.full_kv import FullKVConfig
from sfibench.baselines.quest import QuestConfig
from sfibench.baselines.snapkv import SnapKVConfig
from sfibench.baselines.streaming_llm import StreamingLLMConfig
from sfibench.baselines.tidaldecode import TidalDecodeConfig
from sfibench.engine.method import MethodSpec
from sfibench.sfi.config import SFIConfig, TriggerConfig

SMALL_CONFIGS = {
    "full_kv": FullKVConfig(),
    "sfi": SFIConfig(n_sink=4, n_recent=16, k_head=12, page=4, w_prefill=8, trigger=TriggerConfig(t_max=12, min_gap=4)),
    "streaming_llm": StreamingLLMConfig(budget=36),
    "snapkv": SnapKVConfig(budget=36, window=8),
    # the tiny models have 2-3 layers: no dense first layers, one selection layer
    "quest": QuestConfig(page=4, budget=20, dense_layers=0),
    "tidaldecode": TidalDecodeConfig(budget=20, dense_layers=0, selection_layer=0, reselection_fraction=None),
}

METHOD_PATHS = registry.available()  # every (method, path) pair
SPARSE_PATHS = [(name, path) for name, path in METHOD_PATHS if not registry.get(name).dense]


def small_spec(name: str, path: str, **changes) -> MethodSpec:
    """`name` on `path` at its small settings; `changes` are fields of its config to set (e.g. layer_groups=2)."""
    return MethodSpec(name, path, dataclasses.replace(SMALL_CONFIGS[name], **changes))
