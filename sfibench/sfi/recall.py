"""SFI's memory as `sfibench stability` compares it: the selection made at the last refresh (stale), and
one made afresh at every step (fresh), each with the sinks and the recent window (SPEC 2, 8).

The stale memory is exactly what fast steps after a refresh read: the Selector's picks from the refresh's
evidence, the sinks, and the recent window anchored at the refresh's start. A refresh is a step the view
marks as a sentence start (a decode slow step: the raw logits of the G query heads, R = G rows, W = 1);
before the first one, where the view carries the prompt's last queries, the memory is the bootstrap
selection prefill makes from the last `w_prefill` of them (SPEC 4), so the first decode steps read what
SFI's would. The cached key norms feed the prior.
"""

from __future__ import annotations

import torch

from sfibench.engine.method import AttentionView, RecallMemory
from sfibench.sfi.geometry import recent_start
from sfibench.sfi.selector import select


def selection_mask(logits: torch.Tensor, key_norms: torch.Tensor, lo: int, hi: int, k: int, cfg) -> torch.Tensor:
    """What the SFI Selector keeps from evidence `[..., H, R, L']` over C = [lo, hi), as a bool mask
    `[..., H, W]` over the key norms' positions `[..., H, W]`."""
    picks = select(logits[..., lo:hi], key_norms[..., lo:hi], lo, k, cfg.selector)
    mask = torch.zeros(key_norms.shape, dtype=torch.bool, device=logits.device)
    return mask.scatter_(-1, picks, True)


def memory_mask(fixed: torch.Tensor, n_sink: int, window_start: int) -> torch.Tensor:
    """sinks ∪ fixed ∪ [window_start, L): the positions a fast step reads (SPEC 2)."""
    positions = torch.arange(fixed.shape[-1], device=fixed.device)
    return fixed | (positions < n_sink) | (positions >= window_start)


def _grow(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Extend a mask from an earlier, shorter context with False for the positions added since."""
    extra = length - mask.shape[-1]
    return torch.cat([mask, mask.new_zeros(mask.shape[:-1] + (extra,))], dim=-1) if extra else mask


def bootstrap_evidence(view: AttentionView, rows: int) -> torch.Tensor:
    """Logits `[layers, H_kv, G x rows, P]` of the last `rows` prompt queries over the P prompt positions,
    each row over the positions it may attend to (-inf after its own)."""
    queries = view.prompt_queries[:, :, -rows:].float()  # [layers, H_q, rows, D]
    layers, heads, _, dim = queries.shape
    kv_heads, prompt = view.keys.shape[1], view.prompt_length
    grouped = queries.reshape(layers, kv_heads, (heads // kv_heads) * rows, dim)  # rows of a head together
    logits = torch.matmul(grouped, view.keys[:, :, :prompt].float().transpose(-1, -2)) * dim ** -0.5
    row_position = (prompt - rows + torch.arange(rows, device=logits.device)).repeat(heads // kv_heads)
    hidden = torch.arange(prompt, device=logits.device)[None, :] > row_position[:, None]
    return logits.masked_fill(hidden, float("-inf"))


class SFIRecall(RecallMemory):
    names = ("stale", "fresh")
    labels = {"stale": "SFI, selected at t0 (stale)", "fresh": "SFI, selected at t (fresh)"}

    def __init__(self, cfg, selection_budget):
        self.cfg, self.selection_budget = cfg, selection_budget
        self.start: dict | None = None  # the selection and window anchor at the last refresh

    def _refresh(self, logits: torch.Tensor, key_norms: torch.Tensor, length: int) -> None:
        """A selection from `logits` over the candidates of a `length`-token context."""
        cfg = self.cfg
        lo, hi = min(cfg.n_sink, length), recent_start(length, cfg.n_recent, cfg.page)
        k = self.selection_budget.resolve(length, "--k-head", at_most_context=False)
        self.start = {"anchor": hi, "k": k,
                      "selected": selection_mask(logits, key_norms[..., :length], lo, hi, k, cfg)}

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        cfg, length = self.cfg, view.logits.shape[-1]
        if view.sentence_start:  # a refresh: the selection the following fast steps read
            self._refresh(view.logits, view.key_norms, length)
            return None
        if self.start is None and view.prompt_queries is not None and view.keys is not None:
            prompt = view.prompt_length
            rows = min(cfg.w_prefill, view.prompt_queries.shape[2])
            self._refresh(bootstrap_evidence(view, rows), view.key_norms, prompt)
        if self.start is None:  # steps before the first refresh have no selection to read
            return None
        lo, hi = min(cfg.n_sink, length), recent_start(length, cfg.n_recent, cfg.page)
        out = {"stale": memory_mask(_grow(self.start["selected"], length), cfg.n_sink,
                                    min(self.start["anchor"], hi))}
        if self.wanted is None or "fresh" in self.wanted:
            out["fresh"] = memory_mask(selection_mask(view.logits, view.key_norms, lo, hi, self.start["k"], cfg),
                                       cfg.n_sink, hi)
        return out
