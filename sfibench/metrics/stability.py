"""Attention-support stability (SPEC section 8): the analysis's settings, their checks, and the set
arithmetic the reducer (metrics/stability_reducer.py) applies one decode step at a time.

SFI's premise is that the positions dominating attention (the *support*) stay put within a sentence
and move at sentence boundaries. At every step the dense attention of the G query heads of each
(layer, KV head) is pooled (mean of their softmax probabilities, i.e. the share of the group's
attention each position gets) and reduced to supports over the candidate range C = [n_sink,
recent_start): the top-k (k = topk_frac * L) and the smallest set holding `mass` of the candidates'
(renormalised) attention. A model with sliding-window layers is analysed on its global layers, the
only ones any method selects on.

An analysis runs one *segment* per (context, prompt): without contexts, the text's first `prefix`
tokens then `steps` more (teacher-forced, or the model's own when generating); with contexts, a prompt
of `context - steps` tokens (prose from the text, or a quality task's prompt) then `steps` steps, so
the last step sees `context` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sfibench.core.budget import Budget
from sfibench.sfi.config import SFIConfig
from sfibench.sfi.geometry import recent_start

HIST_BINS = 20  # overlap histograms over [0, 1]
DEFAULT_K_HEAD = Budget(percent=10.0)
PROSE = "prose"  # the prompt source that is the text itself (other sources are quality task names)
TRIGGERS = ("sentence", "fixed")


@dataclass(frozen=True)
class StabilityConfig:
    """Every knob of `sfibench stability`; defaults are the CLI defaults."""

    model: str = "smollm2-135m"
    text_file: str | None = None  # None: the English essays shipped in sfibench/workloads/data
    generate: bool = False  # True: the model's own (sampled) continuation of the prose
    steps: int = 2000  # decode steps analysed per segment
    prefix: int = 512  # without contexts: prompt tokens prefilled first, so candidates exist from the first step
    contexts: tuple[int, ...] = ()  # tokens at each segment's last step; empty: one segment of prefix + steps
    prompts: tuple[str, ...] = (PROSE,)  # with contexts: the text, and/or quality tasks (always generated)
    samples: int = 1  # prompts of each task per context
    topk_frac: float = 0.02  # support size as a fraction of the context
    mass: float = 0.9  # the second support: smallest candidate set holding this share of their mass
    k_head: Budget = DEFAULT_K_HEAD  # selected tokens per KV head: tokens (300) or a percentage of L at t0
    max_offset: int = 64  # drift is binned by t - t0 up to this; later offsets share the last bin
    trigger: str = "sentence"  # fixed: also compare refreshing every `interval` steps at the same rate
    interval: int | None = None  # the fixed trigger's steps between refreshes; None: the sentence trigger's rate
    variant: dict = field(default_factory=dict)  # a Selector ablation compared beside SFI as specified
    temperature: float = 0.7  # generated text: greedy decoding of a small model loops
    top_p: float = 0.95
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    path: str = "reference"  # the path of the Full-KV method the dense probe stands for
    sfi: SFIConfig = field(default_factory=SFIConfig)  # sinks, recent window, page and Selector

    def prompt_lengths(self) -> list[int]:
        """Tokens prefilled before the first analysed step, one per context (the prefix without contexts)."""
        return [context - self.steps for context in self.contexts] or [self.prefix]


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
    if cfg.trigger not in TRIGGERS:
        raise StabilityInputError(f"trigger {cfg.trigger!r} is not one of: {', '.join(TRIGGERS)}")
    if cfg.interval is not None and cfg.trigger != "fixed":
        raise StabilityInputError("an interval is the fixed trigger's; set trigger to fixed (--fixed-refresh N)")
    if not cfg.contexts and cfg.prompts != (PROSE,):
        raise StabilityInputError("task prompts are sized to a context; give --ctx (e.g. --ctx 8k) with --prompts")
    least = cfg.sfi.n_sink + cfg.sfi.n_recent + cfg.sfi.page
    for context, prompt in zip(cfg.contexts or [None], cfg.prompt_lengths()):
        if recent_start(prompt + 1, cfg.sfi.n_recent, cfg.sfi.page) > cfg.sfi.n_sink:
            cfg.k_head.resolve(prompt, "--k-head", at_most_context=False)  # a percentage must give a token
            continue
        if context is None:
            raise StabilityInputError(
                f"a {prompt}-token prefix leaves no candidate positions between the {cfg.sfi.n_sink} sinks and the "
                f"{cfg.sfi.n_recent}-token recent window; use --prefix {least} or more")
        raise StabilityInputError(
            f"--ctx {context} leaves a {prompt}-token prompt before the {cfg.steps} steps, with no candidate "
            f"positions beside the sinks and the recent window; give --ctx {cfg.steps + least} or more, or fewer --steps")


def check_context(cfg: StabilityConfig, max_context: int, model: str) -> None:
    """Every segment must fit the model: its prompt and its steps."""
    for prompt in cfg.prompt_lengths():
        if prompt + cfg.steps > max_context:
            what = (f"--ctx {prompt + cfg.steps}" if cfg.contexts
                    else f"a {prompt}-token prefix + {cfg.steps} steps ({prompt + cfg.steps} tokens)")
            raise StabilityInputError(
                f"{model} has a context of {max_context} tokens, but {what} is beyond it; ask for a context up to "
                f"{max_context} (fewer --steps without --ctx) or use a model with a longer context")


def analysed_layers(model_config) -> list[int]:
    """The layers the analysis reads: every global layer (a sliding-window layer is already sparse, and no
    method selects on it). A model made only of sliding-window layers has none to analyse."""
    layers = model_config.global_layers
    if not layers:
        raise StabilityInputError(
            f"{model_config.name} has no global layer: all {model_config.num_layers} layers attend a "
            f"{model_config.sliding_window}-token sliding window, and every method selects on global layers "
            "only; analyse a model with global layers")
    return list(layers)


def pooled_attention(logits: torch.Tensor) -> torch.Tensor:
    """Dense attention logits `[..., H, G, L]` -> mean over the G query heads of their softmax, `[..., H, L]`."""
    return logits.float().softmax(dim=-1).mean(dim=-2)


def _place(mask_c: torch.Tensor, lo: int, width: int) -> torch.Tensor:
    """A mask over candidates [lo, lo + n) -> a mask over positions [0, width)."""
    full = torch.zeros(mask_c.shape[:-1] + (width,), dtype=torch.bool, device=mask_c.device)
    full[..., lo:lo + mask_c.shape[-1]] = mask_c
    return full


def top_k_support(weights: torch.Tensor, lo: int, hi: int, k: int) -> torch.Tensor:
    """The min(k, hi - lo) candidates of [lo, hi) with the most attention, as a bool mask `[..., L]`."""
    cand = weights[..., lo:hi]
    order = cand.topk(min(k, cand.shape[-1]), dim=-1).indices
    return _place(torch.zeros_like(cand, dtype=torch.bool).scatter_(-1, order, True), lo, weights.shape[-1])


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


def grow(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Extend a mask from an earlier, shorter context with False for the positions added since."""
    extra = length - mask.shape[-1]
    return torch.cat([mask, mask.new_zeros(mask.shape[:-1] + (extra,))], dim=-1) if extra else mask


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
