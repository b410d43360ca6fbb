"""The stability analysis of one segment, reduced on the fly one decode step at a time (SPEC section 8).

At every step, for each analysed (layer, KV head), from the pooled dense attention (metrics/stability.py):

- consecutive overlap |S_t ∩ S_t-1| / min(|S_t|, |S_t-1|) and Jaccard, split by whether step t opens
  a new sentence (a boundary lies between the two steps) or not. The min denominator is |S|/k of SPEC
  when k is unchanged, and keeps a constant ranking at overlap 1 while k = topk_frac * L grows by one;
  the same top-k overlap per query head (each head's own attention), to show which heads move;
- drift: the same overlap against the support at the sentence's first step t0, by offset t - t0;
- recall: the share of step t's attention mass that each memory reads (metrics/stability_memories.py):
  SFI's, selected by its real Selector at t0 (stale) and at t (fresh), the others' at as many tokens
  per (layer, KV head) as the stale memory reads there. Each memory's label is recorded beside its
  numbers, so reports list whatever memories a run compared;
- where the attention and what the stale memory misses sit, by distance (metrics/stability_where.py),
  the needle's tokens in every memory at a needle task's answer steps, and, with a fixed trigger, the
  recall each trigger gives.

Only the previous step's supports and the sentence start's supports and selection are kept (boolean
masks); everything else is sums, counts and fixed histograms, so memory does not grow with the steps.
"""

from __future__ import annotations

import torch

from sfibench.engine.method import AttentionView
from sfibench.metrics.stability import (
    HIST_BINS,
    Mean,
    StabilityConfig,
    grow,
    pooled_attention,
    set_overlap,
    supports,
    top_k_support,
)
from sfibench.metrics.stability_memories import (
    REFERENCE_STALE,
    TriggerComparison,
    fixed_memory,
    recall_memories,
)
from sfibench.metrics.stability_where import MovingMass, NeedleWatch
from sfibench.sfi.geometry import recent_start

KINDS = ("topk", "mass")  # the two support definitions
SIDES = ("within", "across")  # step t continues the sentence of t-1, or opens a new one


class StabilityReducer:
    """Feed one decode step at a time with `update`; `summary()` gives JSON-ready results.

    `layers`: how many layers the steps carry, or the model layer of each (a model with sliding-window
    layers is analysed on its global ones). `prompt`: (the last prompt queries `[layers, H_q, W, D]`, the
    prompt's length), for memories that choose from the prompt. `fixed_interval`: compare a fixed
    refresh trigger at this interval. `needle`: watch a needle's tokens at the answer steps.
    """

    def __init__(self, cfg: StabilityConfig, layers, num_kv_heads: int, model_config=None,
                 prompt: tuple[torch.Tensor, int] | None = None, fixed_interval: int | None = None,
                 needle: NeedleWatch | None = None):
        self.cfg = cfg
        self.layers = tuple(range(layers)) if isinstance(layers, int) else tuple(layers)
        self.model_config = model_config  # handed to the memories (None: memories that need it compare nothing)
        self.prompt = prompt
        self.memories = recall_memories(cfg)
        names = [name for memory in self.memories for name in memory.names]
        self.labels = {name: memory.labels.get(name, name) for memory in self.memories for name in memory.names}
        count = len(self.layers)
        shape = (count, num_kv_heads)
        bins = cfg.max_offset + 1  # index = offset t - t0; 0 (the start itself) stays empty
        self.step = 0
        self.prev: dict | None = None  # supports of the previous step
        self.start: dict | None = None  # the step and supports at the sentence start
        self.sentence_starts: list[int] = []
        self.consecutive = {(kind, side, metric): Mean(*shape)
                            for kind in KINDS for side in SIDES for metric in ("overlap", "jaccard")}
        self.consecutive_overall = {(kind, side): Mean() for kind in KINDS for side in SIDES}  # per step pair
        self.hist = {key: torch.zeros(HIST_BINS, dtype=torch.float64) for key in self.consecutive}
        self.drift = {kind: Mean(bins) for kind in KINDS}
        self.layer_overlap = {side: Mean(count) for side in SIDES}  # top-k, one sample per step pair
        self.head_overlap: dict[str, Mean] = {}  # side -> Mean(layers, H_q): each query head's own top-k
        self.recall = {name: Mean(*shape) for name in names}
        self.recall_by_offset = {name: Mean(bins) for name in names}
        self.captured = {name: Mean(*shape) for name in names}  # mass read inside C
        self.tokens_read = {name: Mean() for name in names}
        self.candidate_mass = Mean(*shape)
        self.chance_overlap = Mean()  # k / |C|: expected overlap of two unrelated top-k sets, for scale
        self.moving = MovingMass(count, cfg.sfi.n_sink)
        self.needle = needle
        self.trigger = (TriggerComparison(fixed_memory(cfg, fixed_interval), count, num_kv_heads)
                        if fixed_interval else None)

    def update(self, logits: torch.Tensor, key_norms: torch.Tensor, sentence_start: bool,
               queries: torch.Tensor | None = None, keys: torch.Tensor | None = None) -> None:
        """One step: dense logits `[layers, H, G, L]` of its query, key norms `[layers, H, L]`, and where the
        caller has them the step's queries `[layers, H_q, D]` and the cached keys `[layers, H, L, D]`.

        `sentence_start`: this step's input token opens a new sentence (SPEC 3), so a boundary lies
        between this step and the previous one, and this step is t0 of the new sentence.
        """
        cfg, sfi = self.cfg, self.cfg.sfi  # the candidate range C is SFI's (SPEC 8)
        self.step += 1
        length = logits.shape[-1]
        pooled = pooled_attention(logits)
        lo = min(sfi.n_sink, length)
        hi = recent_start(length, sfi.n_recent, sfi.page)
        k = max(1, round(cfg.topk_frac * length))
        top, held = supports(pooled, lo, hi, k, cfg.mass)
        per_head = top_k_support(logits.float().softmax(dim=-1), lo, hi, k)  # [layers, H, G, L]
        self.chance_overlap.add(torch.tensor(min(k, hi - lo) / (hi - lo)))
        current = {"topk": top, "mass": held, "heads": per_head}
        if self.prev is not None:
            self._consecutive(current, "across" if sentence_start else "within", length)
        prompt_queries, prompt_length = self.prompt or (None, None)
        view = AttentionView(logits, key_norms, sentence_start, queries=queries, keys=keys,
                             model_config=self.model_config, layers=self.layers, prompt_queries=prompt_queries,
                             prompt_length=prompt_length)
        memories = self.memories[0].masks(view)  # the budget reference's: the others read as many tokens
        stale = None if memories is None else memories[REFERENCE_STALE]
        if self.trigger is not None:
            self.trigger.update(view, pooled, stale)
        if memories is not None:
            view.budget = stale.sum(dim=-1, keepdim=True)
            for memory in self.memories[1:]:
                memories.update(memory.masks(view) or {})
        if self.needle is not None:
            self.needle.update(self.step, pooled, memories or {}, sentence_start)
        if sentence_start:
            self.start = {"step": self.step, "supports": current}
            self.sentence_starts.append(self.step)
        elif self.start is not None:  # steps before the first boundary belong to no observed sentence
            self._within_sentence(pooled, current, lo, hi, memories or {})
        self.prev = current

    def _consecutive(self, current: dict, side: str, length: int) -> None:
        for kind in KINDS:
            overlap, jaccard = set_overlap(current[kind], grow(self.prev[kind], length))
            for metric, values in (("overlap", overlap), ("jaccard", jaccard)):
                self.consecutive[kind, side, metric].add(values)
                self.hist[kind, side, metric] += torch.histc(values.double().cpu(), HIST_BINS, 0, 1)
            self.consecutive_overall[kind, side].add(overlap.mean())
            if kind == "topk":
                self.layer_overlap[side].add(overlap.mean(dim=-1))
        heads, _ = set_overlap(current["heads"], grow(self.prev["heads"], length))  # [layers, H, G]
        self.head_overlap.setdefault(side, Mean(heads.shape[0], heads.shape[1] * heads.shape[2]))
        self.head_overlap[side].add(heads.flatten(1))
        self.moving.update_entering(current["topk"] & ~grow(self.prev["topk"], length), side)

    def _within_sentence(self, pooled, current: dict, lo: int, hi: int, memories: dict) -> None:
        start, length = self.start, pooled.shape[-1]
        offset = min(self.step - start["step"], self.cfg.max_offset)
        for kind in KINDS:
            overlap, _ = set_overlap(current[kind], grow(start["supports"][kind], length))
            self.drift[kind].add(overlap.mean(), offset)
        positions = torch.arange(length, device=pooled.device)
        candidates = (positions >= lo) & (positions < hi)
        self.candidate_mass.add((pooled * candidates).sum(dim=-1))
        self.moving.update_mass(pooled, memories.get(REFERENCE_STALE))
        for name, memory in memories.items():
            recall = (pooled * memory).sum(dim=-1)
            self.recall[name].add(recall)
            self.recall_by_offset[name].add(recall.mean(), offset)
            self.captured[name].add((pooled * (memory & candidates)).sum(dim=-1))
            self.tokens_read[name].add(memory.sum(dim=-1).double().mean())

    def summary(self) -> dict:
        def overall(mean: Mean) -> float:
            return float(mean.total.sum() / mean.count.sum()) if mean.count.sum() > 0 else float("nan")

        consecutive = {kind: {side: {
            "pairs": int(self.consecutive[kind, side, "overlap"].count[0, 0]),
            **{f"{metric}_mean": overall(self.consecutive[kind, side, metric]) for metric in ("overlap", "jaccard")},
            "overlap_ci95": float(self.consecutive_overall[kind, side].ci95()),  # over step pairs
            **{f"{metric}_per_layer": self.consecutive[kind, side, metric].mean().mean(dim=-1).tolist()
               for metric in ("overlap", "jaccard")},
            **{f"{metric}_hist": self.hist[kind, side, metric].tolist() for metric in ("overlap", "jaccard")},
        } for side in SIDES} for kind in KINDS}
        for side in SIDES:  # over step pairs, of the layer's mean over its KV heads
            consecutive["topk"][side]["overlap_per_layer_ci95"] = self.layer_overlap[side].ci95().tolist()
        candidate_mass = self.candidate_mass.total
        recall = {name: {
            "label": self.labels[name],
            "mean": overall(self.recall[name]),
            "candidate_recall": (float(self.captured[name].total.sum() / candidate_mass.sum())
                                 if candidate_mass.sum() > 0 else None),
            "tokens_read_mean": float(self.tokens_read[name].mean()),
            "per_layer_head": self.recall[name].mean().tolist(),
            "per_layer_head_ci95": self.recall[name].ci95().tolist(),  # over steps
            "candidate_per_layer_head": (self.captured[name].total / candidate_mass.clamp_min(1e-30)).tolist(),
            "by_offset": self.recall_by_offset[name].mean()[1:].tolist(),
            "by_offset_ci95": self.recall_by_offset[name].ci95()[1:].tolist(),  # over sentences
        } for name in self.recall}
        starts = torch.tensor(self.sentence_starts, dtype=torch.float64)
        heads = {side: {"overlap": mean.mean().tolist(), "overlap_ci95": mean.ci95().tolist()}
                 for side, mean in self.head_overlap.items()}  # over step pairs
        return {
            "steps": self.step,
            "layers": list(self.layers),
            "sentences": {"starts": len(self.sentence_starts),
                          "mean_length": float(starts.diff().mean()) if len(starts) > 1 else None},
            "consecutive": consecutive,
            "hist_edges": torch.linspace(0, 1, HIST_BINS + 1).tolist(),
            "drift": {"offsets": list(range(1, self.cfg.max_offset + 1)),
                      "samples": self.drift["topk"].count[1:].long().tolist(),
                      **{f"{kind}_overlap": self.drift[kind].mean()[1:].tolist() for kind in KINDS},
                      **{f"{kind}_overlap_ci95": self.drift[kind].ci95()[1:].tolist() for kind in KINDS}},
            "recall": recall,
            "head_overlap": heads,
            "moving_mass": self.moving.summary(),
            "trigger": None if self.trigger is None else self.trigger.summary(),
            "candidate_mass_share": overall(self.candidate_mass),
            "chance_topk_overlap": float(self.chance_overlap.mean()),
        }
