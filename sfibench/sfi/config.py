"""SFI's settings (SPEC sections 2-5), its one budget rule, and its entry in the registry.

Defaults follow SPEC.md; the CLI exposes the fields as flags and shows these defaults in its help, so this
module imports no torch; the Selector's own settings are sfi/selector_config.py. The budget rule: at a budget of B tokens
read per (layer, KV head), the recent window is a quarter of B in whole pages, between one page and
`n_recent` (256), and k_head is the rest after the sinks, so at SPEC's operating point (B = 2,308)
SFI reads 4 sinks + 2,048 picks + 256 recent tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sfibench.core.budget import BudgetError
from sfibench.core.errors import UsageError
from sfibench.engine.method import MethodConfig, MethodDef
from sfibench.engine.workspace import bucketed_slots, gather_attention_bytes
from sfibench.sfi import geometry, traffic
from sfibench.sfi.selector_config import SelectorConfig

EVIDENCE_CHUNK_BYTES = 1 << 28  # float32 evidence the Selector takes at once (layers are chunked to fit; it and
# the scores over it are the largest transient beside a long-context batch, and a launch per chunk costs little)
# Evidence-sized float32 tensors alive at once in the reference Selector (sfi/selector.pool_evidence): the
# logits, their zero-filled copy, the row log-softmax, its alpha multiple and logsumexp's shifted exponent
REFERENCE_SELECTOR_COPIES = 5

PUBLISH_POLICIES = ("next_step", "when_ready")
TRIGGER_POLICIES = ("punctuation_tmax", "fixed", "random", "bootstrap")  # sfi/triggers.py


@dataclass(frozen=True)
class TriggerConfig:
    """When a sequence takes a slow (dense + refresh) step (SPEC section 3)."""

    policy: str = "punctuation_tmax"  # punctuation_tmax | fixed | random | bootstrap
    t_max: int = 96
    min_gap: int = 16
    interval: int = 32  # N for the `fixed` (every N) and `random` (Bernoulli 1/N) ablations
    seed: int = 0


@dataclass(frozen=True)
class SFIConfig(MethodConfig):
    """Sparse-memory geometry and refresh behaviour of Slow-Fast Inference (SPEC sections 2-4)."""

    n_sink: int = 4
    n_recent: int = 256
    k_head: int = 2048
    page: int = 16
    w_prefill: int = 16  # prompt query rows used as evidence by the bootstrap (prefill) refresh
    layer_groups: int = 1  # 2: even and odd layers refresh on alternate slow steps
    bridge_steps: int = 0  # decode steps after prefill that run densely before the bootstrap selection is used
    publish: str = "next_step"  # next_step: a refresh is used from the next step | when_ready: optimized path,
    #                             the Selector runs on a side stream and its result is used once it is done
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    selector: SelectorConfig = field(default_factory=SelectorConfig)

    def recent_for_budget(self, budget: int) -> int:
        """The recent window at `budget`: a quarter of it in whole pages, within [page, n_recent]."""
        return max(self.page, min(self.n_recent, (budget // 4) // self.page * self.page))

    def with_budget(self, budget: int) -> SFIConfig:
        n_recent = self.recent_for_budget(budget)
        k_head = budget - self.n_sink - n_recent
        if k_head <= 0:
            raise BudgetError(f"a budget of {budget} tokens leaves SFI no room for selected tokens beside "
                              f"{self.n_sink} sinks and a {n_recent}-token recent window; raise it")
        return dataclasses.replace(self, n_recent=n_recent, k_head=k_head)

    def tokens_read(self, context: int) -> int:
        return geometry.tokens_read_after_refresh(context, self)

    def state_bytes(self, model_config, path: str, dtype_bytes: int, tile_rows: int) -> tuple[int, int]:
        mc = model_config
        if path == "optimized":  # a float32 evidence row per query head and slot; two compact K/V buffers
            compact = 2 * mc.num_layers * mc.num_kv_heads * compact_rows(self, tile_rows) * mc.head_dim * 2
            return mc.num_layers * mc.num_heads * 4, compact * dtype_bytes
        # two buffers of int64 positions per KV head, and the step's queries kept for the refresh
        positions = 2 * mc.num_layers * mc.num_kv_heads * self.k_head * 8
        return 0, positions + mc.num_layers * mc.num_heads * mc.head_dim * dtype_bytes

    def workspace_bytes(self, model_config, path: str, dtype_bytes: int, batch: int, max_seq: int,
                        prompt: int) -> int:
        """A refresh's float32 evidence, one chunk of layers at a time (SFIMethod.refresh): the bootstrap's
        `w_prefill` query rows over the prompt's candidates, or a decode refresh's one row over the longest
        history's (the whole history with `evidence_norm="visible"`). The optimized Selector's scores over it
        are one more of the same size; the reference Selector's pooling holds several
        (REFERENCE_SELECTOR_COPIES), and the reference fast step gathers the sparse memory's K/V."""
        mc = model_config

        def width(length: int) -> int:
            return length if self.selector.evidence_norm == "visible" else max(geometry.candidates(length, self), 1)

        per_layer = mc.num_heads * max(self.w_prefill * width(prompt), width(max_seq)) * 4
        evidence = len(mc.global_layers) * per_layer
        chunk = max(min(evidence, EVIDENCE_CHUNK_BYTES), per_layer)
        if path != "reference":
            return 2 * chunk
        # the fast step gathers every sink and pick slot (masked where unused, so at any context) and the tail
        # since the last refresh's recent window: that window, a partial page and the steps decoded since,
        # rounded up to the default length bucket of a graphed step
        read = self.n_sink + self.k_head + bucketed_slots(self.n_recent + self.page + max_seq - prompt, max_seq)
        gather = gather_attention_bytes(batch, mc.num_heads, mc.num_kv_heads, read, mc.head_dim, dtype_bytes)
        return max(REFERENCE_SELECTOR_COPIES * chunk, gather)

    def refresh_bytes(self, model_config, context: int, path: str, dtype_bytes: int) -> float:
        layers = len(model_config.global_layers) / self.layer_groups
        return traffic.refresh_bytes(model_config, geometry.candidates(context, self), self.k_head, 1,
                                     dtype_bytes, layers_refreshed=layers, path=path)

    def variants(self, path: str) -> list[SFIConfig]:
        if path != "optimized":
            return [self]
        return [dataclasses.replace(self, publish=mode) for mode in PUBLISH_POLICIES]

    def row_facts(self) -> dict:
        return {"publish": self.publish}

    def recall_memory(self, selection_budget):
        from sfibench.sfi.recall import SFIRecall  # torch: the settings above load without it

        return SFIRecall(self, selection_budget)

    def with_variant(self, variant: dict | None) -> SFIConfig:
        return with_variant(self, variant)

    def budget_facts(self) -> dict:
        return {"n_sink": self.n_sink, "k_head": self.k_head, "n_recent": self.n_recent,
                "budget": self.n_sink + self.k_head + self.n_recent, "trigger": self.trigger.policy,
                "t_max": self.trigger.t_max, "min_gap": self.trigger.min_gap, "bridge_steps": self.bridge_steps}


def compact_rows(cfg: SFIConfig, align: int) -> int:
    """Rows of a compact buffer: sinks + k_head, rounded up to a multiple of `align` (SelectionState fills
    the last tile with the window's first rows)."""
    return -(-(cfg.n_sink + cfg.k_head) // align) * align


# The authors' operating point (SPEC 4): a fixed k_head beside a 256-token recent window, with SPEC's
# triggers. Every method then reads n_sink + k_head + n_recent tokens per (layer, KV head).
PRESETS = {"paper-2k": 2048, "paper-4k": 4096}  # name -> k_head; 2K for throughput, 4K for quality


def preset_budget(preset: str) -> int:
    """Tokens read per (layer, KV head) at a preset's operating point: sinks + k_head + recent window."""
    if preset not in PRESETS:
        raise UsageError(f"unknown --sfi-preset {preset!r}; valid: {', '.join(PRESETS)}")
    return SFIConfig.n_sink + PRESETS[preset] + SFIConfig.n_recent


def preset_retention(preset: str, context: int) -> float:
    """The retention that gives every method the preset's budget at `context` tokens."""
    budget = preset_budget(preset)
    if budget >= context:
        raise BudgetError(f"--sfi-preset {preset} reads {budget:,} tokens per layer and KV head, all of a "
                          f"{context:,}-token context: SFI would run fully dense (SPEC 4); give a --ctx above "
                          f"{budget:,}")
    return budget / context


# Settings an ablation may change (SPEC 5: every Selector stage switchable), and where each lives.
VARIANT_FIELDS = {"use_prior": "selector", "use_nms": "selector", "use_cross_head": "selector",
                  "nms_radius": "selector", "nms_alpha": "selector", "w_prefill": "sfi", "bridge_steps": "sfi",
                  "publish": "sfi",
                  # ablations beyond the paper (SPEC 5): never on unless asked for
                  "evidence_norm": "selector", "keep_neighbours": "selector",
                  # the refresh's own ablation: policy "bootstrap" keeps the prompt's selection for the whole answer
                  "policy": "trigger"}


def with_variant(cfg: SFIConfig, variant: dict | None) -> SFIConfig:
    """`cfg` with an ablation's settings, e.g. {"use_nms": False}."""
    changed: dict[str, dict] = {"selector": {}, "trigger": {}, "sfi": {}}
    for name, value in (variant or {}).items():
        if name not in VARIANT_FIELDS:
            raise ValueError(f"unknown SFI setting {name!r}; valid: {', '.join(VARIANT_FIELDS)}")
        changed[VARIANT_FIELDS[name]][name] = value
    return dataclasses.replace(cfg, selector=dataclasses.replace(cfg.selector, **changed["selector"]),
                               trigger=dataclasses.replace(cfg.trigger, **changed["trigger"]), **changed["sfi"])


METHOD = MethodDef(
    name="sfi",
    summary="Slow-Fast Inference: sinks + Selector picks + recent window, refreshed densely at sentence ends",
    config=SFIConfig,
    paths={"reference": "sfibench.reference.sfi:ReferenceSFI", "optimized": "sfibench.optimized.sfi:OptimizedSFI"},
)
