"""The memories `sfibench stability` compares, and its comparison of two refresh triggers.

Every registered method that has a recall memory (MethodConfig.recall_memory) is compared, the budget
reference's first; every other memory reads as many tokens per (layer, KV head) as the reference's
stale memory at that step. Beside them, under names of their own:

- the reference with a Selector ablation (`variant`, e.g. no Soft-NMS and neighbours kept), its stale
  memory only;
- the reference refreshed every N steps instead of at sentence starts (`--fixed-refresh`), N matched to
  the sentence trigger's rate. The two triggers are compared by the recall they give over every step
  both have a memory for, a refresh step counting whole (it reads densely), so the same number of
  refreshes buys more or less recall depending only on where they fall.
"""

from __future__ import annotations

import dataclasses

import torch

from sfibench import registry
from sfibench.engine.method import AttentionView, RecallMemory
from sfibench.metrics.stability import Mean, StabilityConfig

REFERENCE_STALE = "stale"  # the reference memory's name for the selection fast steps read


class Renamed(RecallMemory):
    """Another memory's masks under `name_suffix`ed names and the given labels (one per name it keeps)."""

    def __init__(self, memory: RecallMemory, suffix: str, labels: dict[str, str]):
        self.memory = memory
        memory.wanted = frozenset(labels)
        self.rename = {name: f"{name}_{suffix}" for name in labels}
        self.names = tuple(self.rename.values())
        self.labels = {self.rename[name]: label for name, label in labels.items()}

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        out = self.memory.masks(view)
        return None if out is None else {self.rename[name]: out[name] for name in self.rename if name in out}


class Retriggered(RecallMemory):
    """A memory refreshed every `interval` steps (counted from the first step it sees) instead of at
    sentence starts: it sees each step's view with its own refresh flag in place of the sentence start."""

    def __init__(self, memory: RecallMemory, interval: int):
        self.memory, self.interval, self.step = memory, interval, 0
        self.names, self.labels = memory.names, memory.labels

    def refreshes(self) -> bool:
        """Whether the step about to be seen refreshes."""
        return (self.step + 1) % self.interval == 0

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        refresh = self.refreshes()
        self.step += 1
        return self.memory.masks(dataclasses.replace(view, sentence_start=refresh))


def variant_note(variant: dict) -> str:
    """A Selector ablation as the flags that ask for it: {"use_nms": False, "keep_neighbours": 7} ->
    "--no-nms --keep-neighbours 7"."""
    flags = []
    for name, value in variant.items():
        if isinstance(value, bool):
            flags.append(f"--{'' if value else 'no-'}{name.removeprefix('use_').replace('_', '-')}")
        else:
            flags.append(f"--{name.replace('_', '-')} {value}")
    return " ".join(flags)


def recall_memories(cfg: StabilityConfig) -> list[RecallMemory]:
    """The memories compared, the budget reference's first (its settings are `cfg.sfi`): every registered
    method that has one, each at the reference's tokens read, then the reference's Selector ablation."""
    selection = cfg.k_head
    others = [registry.default_config(name).recall_memory(selection) for name in registry.names()
              if name != registry.BUDGET_REFERENCE]
    memories = [cfg.sfi.recall_memory(selection), *(memory for memory in others if memory is not None)]
    if cfg.variant:
        ablated = cfg.sfi.with_variant(cfg.variant).recall_memory(selection)
        label = ablated.labels.get(REFERENCE_STALE, REFERENCE_STALE)
        memories.append(Renamed(ablated, "variant", {REFERENCE_STALE: f"{label}, {variant_note(cfg.variant)}"}))
    return memories


def fixed_memory(cfg: StabilityConfig, interval: int) -> Retriggered:
    """The reference's stale memory refreshed every `interval` steps."""
    memory = cfg.sfi.recall_memory(cfg.k_head)
    label = f"{memory.labels.get(REFERENCE_STALE, REFERENCE_STALE).split(',')[0]}, refreshed every {interval} steps"
    return Retriggered(Renamed(memory, "fixed", {REFERENCE_STALE: label}), interval)


class TriggerComparison:
    """Recall of the reference's memory under the sentence trigger and under a fixed interval, over the
    steps both have a memory for; a trigger's own refresh step counts 1 (a slow step reads densely)."""

    def __init__(self, memory: Retriggered, layers: int, kv_heads: int):
        self.memory = memory
        self.recall = {side: Mean(layers, kv_heads) for side in ("sentence", "fixed")}
        self.overall = {side: Mean() for side in ("sentence", "fixed")}
        self.refreshes = {"sentence": 0, "fixed": 0}
        self.difference = Mean()  # sentence minus fixed, paired by step
        self.steps = 0

    def update(self, view: AttentionView, pooled: torch.Tensor, sentence_mask: torch.Tensor | None) -> None:
        """One step: its view (before the budget is set), pooled attention and the sentence trigger's
        stale memory (None on a sentence start or before the first selection)."""
        refresh = self.memory.refreshes()
        fixed = self.memory.masks(view)
        fixed_mask = None if fixed is None else next(iter(fixed.values()))
        sides = {"sentence": (view.sentence_start, sentence_mask), "fixed": (refresh, fixed_mask)}
        if any(mask is None and not slow for slow, mask in sides.values()):
            return  # a trigger with no selection yet: compare only steps both can serve
        self.steps += 1
        means = {}
        for side, (slow, mask) in sides.items():
            self.refreshes[side] += bool(slow)
            recall = torch.ones(pooled.shape[:-1]) if slow else (pooled * mask).sum(dim=-1).cpu()
            self.recall[side].add(recall)
            means[side] = recall.mean()
            self.overall[side].add(means[side])
        self.difference.add(means["sentence"] - means["fixed"])

    def summary(self) -> dict:
        def side(name: str) -> dict:
            refreshes = self.refreshes[name]
            return {"refreshes": refreshes, "recall": float(self.overall[name].mean()),
                    "recall_ci95": float(self.overall[name].ci95()),
                    "per_layer": self.recall[name].mean().mean(dim=-1).tolist(),
                    "per_layer_head": self.recall[name].mean().tolist()}

        return {"interval": self.memory.interval, "steps": self.steps, "label": next(iter(self.memory.labels.values())),
                "sentence": side("sentence"), "fixed": side("fixed"),
                "difference": float(self.difference.mean()), "difference_ci95": float(self.difference.ci95())}
