"""Attention-support stability (SPEC section 8), reduced on the fly one decode step at a time.

SFI's premise is that the positions dominating attention (the *support*) stay put within a sentence
and move at sentence boundaries. At every step this module takes the dense attention of the G query
heads of each (layer, KV head), pools them (mean of their softmax probabilities, i.e. the share of
the group's attention each position gets), and reduces it to running sums:

- supports over the candidate range C = [n_sink, recent_start): the top-k (k = topk_frac * L) and the
  smallest set holding `mass` of the candidates' (renormalised) attention;
- consecutive overlap |S_t ∩ S_t-1| / min(|S_t|, |S_t-1|) and Jaccard, split by whether step t opens
  a new sentence (a boundary lies between the two steps) or not. The min denominator is |S|/k of SPEC
  when k is unchanged, and keeps a constant ranking at overlap 1 while k = topk_frac * L grows by one;
- drift: the same overlap against the support at the sentence's first step t0, by offset t - t0;
- recall: the share of step t's attention mass that each method's memory reads (MethodConfig.recall_memory,
  every registered method that has one): SFI's, selected by its real Selector at t0 (stale) and at t
  (fresh), and the others' at as many tokens per (layer, KV head) as the stale memory reads there (each
  method says how it spends them; a memory that ranks pages by key bounds is handed the step's queries
  and the cached keys). Each memory's label is recorded beside its numbers, so reports list whatever
  memories a run compared.

Only the previous step's supports and the sentence start's supports and selection are kept (boolean
masks per (layer, KV head)); everything else is sums, counts and fixed histograms, so memory does not
grow with the number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sfibench import registry
from sfibench.core.budget import Budget
from sfibench.engine.method import AttentionView, RecallMemory
from sfibench.sfi.config import SFIConfig
from sfibench.sfi.geometry import recent_start

HIST_BINS = 20  # overlap histograms over [0, 1]
DEFAULT_K_HEAD = Budget(percent=10.0)


@dataclass(frozen=True)
class StabilityConfig:
    """Every knob of `sfibench stability`; defaults are the CLI defaults."""

    model: str = "smollm2-135m"
    text_file: str | None = None  # None: the English essays shipped in sfibench/workloads/data
    generate: bool = False  # True: the model's own (sampled) continuation of the text's prefix
    steps: int = 2000  # decode steps analysed
    prefix: int = 512  # prompt tokens prefilled first, so candidates exist from the first step
    topk_frac: float = 0.02  # support size as a fraction of the context
    mass: float = 0.9  # the second support: smallest candidate set holding this share of their mass
    k_head: Budget = DEFAULT_K_HEAD  # selected tokens per KV head: tokens (300) or a percentage of L at t0
    max_offset: int = 64  # drift is binned by t - t0 up to this; later offsets share the last bin
    temperature: float = 0.7  # --generate only: greedy decoding of a 135M model loops
    top_p: float = 0.95
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    path: str = "reference"  # the path of the Full-KV method the dense probe stands for
    sfi: SFIConfig = field(default_factory=SFIConfig)  # sinks, recent window, page and Selector


class StabilityInputError(ValueError):
    pass


def check_config(cfg: StabilityConfig) -> None:
    """Reject settings that cannot give a meaningful analysis, before any model is loaded."""
    if not 0.0 < cfg.topk_frac < 1.0:
        raise StabilityInputError(f"--topk-frac must lie strictly between 0 and 1, got {cfg.topk_frac}")
    if not 0.0 < cfg.mass <= 1.0:
        raise StabilityInputError(f"--mass must lie in (0, 1], got {cfg.mass}")
    if cfg.steps < 2:
        raise StabilityInputError(f"--steps must be at least 2 (overlap compares consecutive steps), got {cfg.steps}")
    if cfg.max_offset < 1:
        raise StabilityInputError(f"--max-offset must be at least 1, got {cfg.max_offset}")
    first_hi = recent_start(cfg.prefix + 1, cfg.sfi.n_recent, cfg.sfi.page)
    if first_hi <= cfg.sfi.n_sink:
        raise StabilityInputError(
            f"a {cfg.prefix}-token prefix leaves no candidate positions between the {cfg.sfi.n_sink} sinks and "
            f"the {cfg.sfi.n_recent}-token recent window; use --prefix {cfg.sfi.n_sink + cfg.sfi.n_recent + cfg.sfi.page} "
            "or more")
    cfg.k_head.resolve(cfg.prefix, "--k-head", at_most_context=False)  # a percentage must give a token at the start


def pooled_attention(logits: torch.Tensor) -> torch.Tensor:
    """Dense attention logits `[..., H, G, L]` -> mean over the G query heads of their softmax, `[..., H, L]`."""
    return logits.float().softmax(dim=-1).mean(dim=-2)


def _place(mask_c: torch.Tensor, lo: int, width: int) -> torch.Tensor:
    """A mask over candidates [lo, lo + n) -> a mask over positions [0, width)."""
    full = torch.zeros(mask_c.shape[:-1] + (width,), dtype=torch.bool, device=mask_c.device)
    full[..., lo:lo + mask_c.shape[-1]] = mask_c
    return full


def supports(pooled: torch.Tensor, lo: int, hi: int, k: int, mass: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The two supports over the candidates [lo, hi), as bool masks `[..., H, L]` (one sort for both).

    - top-k: the min(k, hi - lo) candidates with the most attention;
    - mass: the smallest candidate set holding `mass` of the attention on [lo, hi), renormalised there,
      because sinks and the recent window usually hold most of the total: 90% of it often cannot be
      reached inside C at all.
    """
    cand = pooled[..., lo:hi]
    ranked, order = cand.sort(dim=-1, descending=True)
    rank = torch.arange(cand.shape[-1], device=cand.device)
    share = ranked.cumsum(dim=-1) / ranked.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    needed = (share < mass).sum(dim=-1, keepdim=True) + 1  # the first rank whose cumulative share reaches it
    masks = []
    for keep in (rank < k, rank < needed):
        mask_c = torch.zeros_like(cand, dtype=torch.bool).scatter_(-1, order, keep.expand_as(order))
        masks.append(_place(mask_c, lo, pooled.shape[-1]))
    return masks[0], masks[1]


def set_overlap(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(|a ∩ b| / min(|a|, |b|), |a ∩ b| / |a ∪ b|) of bool masks `[..., L]`; 0 for empty sets."""
    inter = (a & b).sum(dim=-1).float()
    smaller = torch.minimum(a.sum(dim=-1), b.sum(dim=-1)).float()
    union = (a | b).sum(dim=-1).float()
    return inter / smaller.clamp_min(1), inter / union.clamp_min(1)


def recall_memories(cfg: StabilityConfig) -> list[RecallMemory]:
    """The memories compared, the budget reference's first (its settings are `cfg.sfi`): every registered
    method that has one, each at the reference's tokens read."""
    selection = cfg.k_head
    others = [registry.default_config(name).recall_memory(selection) for name in registry.names()
              if name != registry.BUDGET_REFERENCE]
    return [cfg.sfi.recall_memory(selection), *(memory for memory in others if memory is not None)]


class Mean:
    """Running sum, sum of squares and count, elementwise over a fixed shape: each `add` is one sample."""

    def __init__(self, *shape: int):
        self.total = torch.zeros(shape, dtype=torch.float64)
        self.squares = torch.zeros(shape, dtype=torch.float64)
        self.count = torch.zeros(shape, dtype=torch.float64)

    def add(self, values: torch.Tensor, index: int | None = None) -> None:
        """Add `values` (the whole shape), or one scalar at `index` of a 1-D accumulator."""
        values = values.double().cpu()
        where = ... if index is None else index
        self.total[where] += values
        self.squares[where] += values * values
        self.count[where] += 1

    def mean(self) -> torch.Tensor:
        return torch.where(self.count > 0, self.total / self.count.clamp_min(1), float("nan"))

    def ci95(self) -> torch.Tensor:
        """Half-width of the normal 95% interval of each mean over its samples; NaN below two samples."""
        n = self.count
        variance = (self.squares - self.total * self.total / n.clamp_min(1)) / (n - 1).clamp_min(1)
        return torch.where(n > 1, 1.96 * (variance.clamp_min(0) / n.clamp_min(1)).sqrt(), float("nan"))


def _grow(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Extend a mask from an earlier, shorter context with False for the positions added since."""
    extra = length - mask.shape[-1]
    return torch.cat([mask, mask.new_zeros(mask.shape[:-1] + (extra,))], dim=-1) if extra else mask


KINDS = ("topk", "mass")  # the two support definitions
SIDES = ("within", "across")  # step t continues the sentence of t-1, or opens a new one


class StabilityReducer:
    """Feed one decode step at a time with `update`; `summary()` gives JSON-ready results."""

    def __init__(self, cfg: StabilityConfig, num_layers: int, num_kv_heads: int, model_config=None):
        self.cfg = cfg
        self.model_config = model_config  # handed to the memories (None: memories that need it compare nothing)
        self.memories = recall_memories(cfg)
        names = [name for memory in self.memories for name in memory.names]
        self.labels = {name: memory.labels.get(name, name) for memory in self.memories for name in memory.names}
        shape = (num_layers, num_kv_heads)
        bins = cfg.max_offset + 1  # index = offset t - t0; 0 (the start itself) stays empty
        self.step = 0
        self.prev: dict | None = None  # supports of the previous step
        self.start: dict | None = None  # the step and supports at the sentence start
        self.sentence_starts: list[int] = []
        self.consecutive = {(kind, side, metric): Mean(*shape)
                            for kind in KINDS for side in SIDES for metric in ("overlap", "jaccard")}
        self.hist = {key: torch.zeros(HIST_BINS, dtype=torch.float64) for key in self.consecutive}
        self.drift = {kind: Mean(bins) for kind in KINDS}
        self.layer_overlap = {side: Mean(num_layers) for side in SIDES}  # top-k, one sample per step pair
        self.recall = {name: Mean(*shape) for name in names}
        self.recall_by_offset = {name: Mean(bins) for name in names}
        self.captured = {name: Mean(*shape) for name in names}  # mass read inside C
        self.tokens_read = {name: Mean() for name in names}
        self.candidate_mass = Mean(*shape)
        self.chance_overlap = Mean()  # k / |C|: expected overlap of two unrelated top-k sets, for scale

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
        self.chance_overlap.add(torch.tensor(min(k, hi - lo) / (hi - lo)))
        current = {"topk": top, "mass": held}
        if self.prev is not None:
            side = "across" if sentence_start else "within"
            for kind, support in current.items():
                overlap, jaccard = set_overlap(support, _grow(self.prev[kind], length))
                for metric, values in (("overlap", overlap), ("jaccard", jaccard)):
                    self.consecutive[kind, side, metric].add(values)
                    self.hist[kind, side, metric] += torch.histc(values.double().cpu(), HIST_BINS, 0, 1)
                if kind == "topk":
                    self.layer_overlap[side].add(overlap.mean(dim=-1))
        view = AttentionView(logits, key_norms, sentence_start, queries=queries, keys=keys,
                             model_config=self.model_config)
        memories = self.memories[0].masks(view)  # the budget reference's: the others read as many tokens
        if memories is not None:
            view.budget = next(iter(memories.values())).sum(dim=-1, keepdim=True)
            for memory in self.memories[1:]:
                memories.update(memory.masks(view) or {})
        if sentence_start:
            self.start = {"step": self.step, "supports": current}
            self.sentence_starts.append(self.step)
        elif self.start is not None:  # steps before the first boundary belong to no observed sentence
            self._within_sentence(pooled, current, lo, hi, memories or {})
        self.prev = current

    def _within_sentence(self, pooled, current: dict, lo: int, hi: int, memories: dict) -> None:
        start, length = self.start, pooled.shape[-1]
        offset = min(self.step - start["step"], self.cfg.max_offset)
        for kind, support in current.items():
            overlap, _ = set_overlap(support, _grow(start["supports"][kind], length))
            self.drift[kind].add(overlap.mean(), offset)
        positions = torch.arange(length, device=pooled.device)
        candidates = (positions >= lo) & (positions < hi)
        self.candidate_mass.add((pooled * candidates).sum(dim=-1))
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
            "candidate_per_layer_head": (self.captured[name].total / candidate_mass.clamp_min(1e-30)).tolist(),
            "by_offset": self.recall_by_offset[name].mean()[1:].tolist(),
            "by_offset_ci95": self.recall_by_offset[name].ci95()[1:].tolist(),  # over sentences
        } for name in self.recall}
        starts = torch.tensor(self.sentence_starts, dtype=torch.float64)
        return {
            "steps": self.step,
            "sentences": {"starts": len(self.sentence_starts),
                          "mean_length": float(starts.diff().mean()) if len(starts) > 1 else None},
            "consecutive": consecutive,
            "hist_edges": torch.linspace(0, 1, HIST_BINS + 1).tolist(),
            "drift": {"offsets": list(range(1, self.cfg.max_offset + 1)),
                      "samples": self.drift["topk"].count[1:].long().tolist(),
                      **{f"{kind}_overlap": self.drift[kind].mean()[1:].tolist() for kind in KINDS},
                      **{f"{kind}_overlap_ci95": self.drift[kind].ci95()[1:].tolist() for kind in KINDS}},
            "recall": recall,
            "candidate_mass_share": overall(self.candidate_mass),
            "chance_topk_overlap": float(self.chance_overlap.mean()),
        }
