"""Where attention moves, for `sfibench stability`: by distance behind the current token, and around
a retrieval task's needle.

- MovingMass: at within-sentence steps, the dense attention mass on the sinks and by distance
  d = L - 1 - j of every other position j, the part of it the stale memory misses, and where the
  positions that newly enter the top-k support sit (within a sentence and across a boundary). Near the
  recent window (a few hundred tokens back) or deep in the history is what decides whether a window or
  a selection has to catch it; the sinks, always read, are kept apart so they do not count as "deep".
- NeedleWatch: at each answer step of a needle task, for every memory, the share of the needle's value
  tokens it holds in each (layer, KV head), and the dense attention mass on them.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from sfibench.metrics.stability import Mean

DISTANCE_EDGES = (256, 1024, 4096, 16384)  # tokens behind the current one; the bins lie between them


BINS = len(DISTANCE_EDGES) + 2  # the sinks, then the distance bins


def distance_labels() -> list[str]:
    def short(tokens: int) -> str:
        return f"{tokens // 1024}K" if tokens >= 1024 else str(tokens)

    edges = [0, *DISTANCE_EDGES]
    return ["sinks", *(f"{short(a)}-{short(b)}" for a, b in pairwise(edges)), f">= {short(edges[-1])}"]


def _bins(length: int, n_sink: int, device) -> torch.Tensor:
    """One-hot `[L, bins]`: the bin of each position of an L-token context (a sink's, or its distance's)."""
    positions = torch.arange(length, device=device)
    index = torch.bucketize(length - 1 - positions, torch.tensor(DISTANCE_EDGES, device=device), right=True) + 1
    return torch.nn.functional.one_hot(torch.where(positions < n_sink, 0, index), BINS).float()


class _ByDistance:
    """Per-layer and overall running means of shares by distance bin; one sample per step."""

    def __init__(self, layers: int):
        self.per_layer, self.overall = Mean(layers, BINS), Mean(BINS)

    def add(self, shares: torch.Tensor) -> None:
        """`shares [layers, H, bins]`: the step's values per (layer, KV head)."""
        self.per_layer.add(shares.mean(dim=1))
        self.overall.add(shares.mean(dim=(0, 1)))

    def add_counts(self, counts: torch.Tensor) -> None:
        """`counts [layers, H, bins]`: shares of the counts pooled over heads (and layers); a step with no
        count at all is no sample."""
        total = counts.sum()
        if total > 0:
            per_layer = counts.sum(dim=1)
            self.per_layer.add(per_layer / per_layer.sum(dim=-1, keepdim=True).clamp_min(1))
            self.overall.add(counts.sum(dim=(0, 1)) / total)

    def summary(self) -> dict:
        return {"mean": self.overall.mean().tolist(), "ci95": self.overall.ci95().tolist(),
                "per_layer": self.per_layer.mean().tolist()}


class MovingMass:
    """By distance bin: the dense mass and the part the stale memory misses at within-sentence steps, and
    the share of newly entering top-k positions within a sentence and across a boundary."""

    SERIES = ("dense_mass", "missed_by_stale", "entering_within", "entering_across")

    def __init__(self, layers: int, n_sink: int):
        self.series = {name: _ByDistance(layers) for name in self.SERIES}
        self.n_sink = n_sink

    def update_mass(self, pooled: torch.Tensor, stale: torch.Tensor | None) -> None:
        """A within-sentence step: pooled attention `[layers, H, L]` and the stale memory's mask (or None)."""
        onehot = _bins(pooled.shape[-1], self.n_sink, pooled.device)
        self.series["dense_mass"].add(pooled @ onehot)
        if stale is not None:
            self.series["missed_by_stale"].add((pooled * ~stale) @ onehot)

    def update_entering(self, entering: torch.Tensor, side: str) -> None:
        """Positions `[layers, H, L]` in this step's top-k support and not in the previous step's."""
        onehot = _bins(entering.shape[-1], self.n_sink, entering.device)
        self.series[f"entering_{side}"].add_counts(entering.float() @ onehot)

    def summary(self) -> dict:
        return {"bins": distance_labels(), **{name: series.summary() for name, series in self.series.items()}}


class NeedleWatch:
    """The needle's value tokens in every memory at each of the first `answer_steps` decode steps."""

    def __init__(self, positions: list[int], answer_steps: int, meta: dict):
        self.positions, self.answer_steps, self.meta = positions, answer_steps, meta
        self.steps: list[dict] = []

    def update(self, step: int, pooled: torch.Tensor, memories: dict, slow: bool) -> None:
        """Step `step` (1-based); `memories` name -> mask `[layers, H, L]`; `slow`: the reference refreshed
        here (its step reads densely, so it holds every token)."""
        if step > self.answer_steps:
            return
        index = torch.tensor(self.positions, device=pooled.device)
        held = {name: mask[..., index].float().mean(dim=-1).mean(dim=-1).tolist() for name, mask in memories.items()}
        self.steps.append({"step": step, "slow": slow, "needle_mass": pooled[..., index].sum(dim=-1).mean(dim=-1).tolist(),
                           "held": held})

    def summary(self, answer: str, answered: bool) -> dict:
        return {**self.meta, "positions": self.positions, "answer_steps": self.answer_steps, "answer": answer,
                "answered": answered, "steps": self.steps}
