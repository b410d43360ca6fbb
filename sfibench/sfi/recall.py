"""SFI's memory as `sfibench stability` compares it: the selection made at a sentence's first step (stale),
and one made afresh at every step (fresh), each with the sinks and the recent window (SPEC 2, 8).

The stale memory is exactly what fast steps after a refresh at t0 read: the Selector's picks from t0's
evidence, the sinks, and the recent window anchored at t0's start. Evidence is a decode slow step's:
the raw logits of the G query heads (R = G rows, W = 1) over C, with the cached key norms for the prior.
"""

from __future__ import annotations

import torch

from sfibench.engine.method import AttentionView, RecallMemory
from sfibench.sfi.geometry import recent_start
from sfibench.sfi.selector import select


def selection_mask(logits: torch.Tensor, key_norms: torch.Tensor, lo: int, hi: int, k: int, cfg) -> torch.Tensor:
    """What the SFI Selector keeps from this step's evidence over C = [lo, hi), as a bool mask `[..., H, L]`."""
    picks = select(logits[..., lo:hi], key_norms[..., lo:hi], lo, k, cfg.selector)
    mask = torch.zeros(logits.shape[:-2] + (logits.shape[-1],), dtype=torch.bool, device=logits.device)
    return mask.scatter_(-1, picks, True)


def memory_mask(fixed: torch.Tensor, n_sink: int, window_start: int) -> torch.Tensor:
    """sinks ∪ fixed ∪ [window_start, L): the positions a fast step reads (SPEC 2)."""
    positions = torch.arange(fixed.shape[-1], device=fixed.device)
    return fixed | (positions < n_sink) | (positions >= window_start)


def _grow(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Extend a mask from an earlier, shorter context with False for the positions added since."""
    extra = length - mask.shape[-1]
    return torch.cat([mask, mask.new_zeros(mask.shape[:-1] + (extra,))], dim=-1) if extra else mask


class SFIRecall(RecallMemory):
    names = ("stale", "fresh")
    labels = {"stale": "SFI, selected at t0 (stale)", "fresh": "SFI, selected at t (fresh)"}

    def __init__(self, cfg, selection_budget):
        self.cfg, self.selection_budget = cfg, selection_budget
        self.start: dict | None = None  # the selection and window anchor at the sentence start

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        cfg, length = self.cfg, view.logits.shape[-1]
        lo, hi = min(cfg.n_sink, length), recent_start(length, cfg.n_recent, cfg.page)
        if view.sentence_start:  # t0: the refresh whose selection the sentence's fast steps read
            k = self.selection_budget.resolve(length, "--k-head", at_most_context=False)
            self.start = {"anchor": hi, "k": k,
                          "selected": selection_mask(view.logits, view.key_norms, lo, hi, k, cfg)}
            return None
        if self.start is None:  # steps before the first boundary belong to no observed sentence
            return None
        stale = memory_mask(_grow(self.start["selected"], length), cfg.n_sink, min(self.start["anchor"], hi))
        fresh = memory_mask(selection_mask(view.logits, view.key_norms, lo, hi, self.start["k"], cfg),
                            cfg.n_sink, hi)
        return {"stale": stale, "fresh": fresh}
