"""SnapKV: one-shot prompt compression chosen by the prompt's last queries, never revisited.

After prefill, the last `window` prompt queries vote for earlier prompt positions (attention mass,
averaged over the window rows and the GQA group), the votes are smoothed by 1-D pooling so that
neighbours of a strong position survive together, and the top positions per KV head are kept along
with the window itself. Decoding reads the kept prompt tokens plus everything generated since.

The optimized path reads the kept rows (with the tail's first rows up to a tile edge, as SFI's refresh fills
its own) and the tail with the two-segment kernel. It keeps only those (engine/compact.py): each prompt's
kept positions, then its observation window and the generated tokens, in a compact cache. On a whole cache
(a caller that keeps one) it copies the kept rows once after prefill into a compact buffer of its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sfibench.baselines.tail_segment import TwoSegmentPath
from sfibench.core.budget import BudgetError
from sfibench.engine.method import AttentionMethod, AttentionView, MethodConfig, MethodDef, RecallMemory
from sfibench.engine.workspace import FLOAT32_BYTES, INDEX_BYTES, bucketed_slots, gather_attention_bytes
from sfibench.optimized.decode_attention import tile_rows
from sfibench.optimized.triton_device import require_triton_device
from sfibench.reference.sparse_memory import TailPlan, attend_fixed_plus_tail

POOLINGS = ("max", "avg")


@dataclass(frozen=True)
class SnapKVConfig(MethodConfig):
    """One-shot prompt compression after prefill (SPEC section 6)."""

    window: int = 64  # last prompt queries that vote, and are always kept
    kernel: int = 7
    pooling: str = "max"  # max | avg
    budget: int = 2308  # prompt tokens kept per KV head, window included

    def with_budget(self, budget: int) -> SnapKVConfig:
        if budget <= self.window:
            raise BudgetError(f"a budget of {budget} tokens is not more than SnapKV's {self.window}-token "
                              "observation window, which it always keeps; raise it")
        return dataclasses.replace(self, budget=budget)

    def tokens_read(self, context: int) -> int:
        return min(self.budget, context)

    def recall_memory(self, selection_budget) -> RecallMemory:
        return SnapKVRecall(self)

    def compact_slots(self, path: str) -> int | None:
        return self.budget if path == "optimized" else None

    def workspace_bytes(self, model_config, path: str, dtype_bytes: int, batch: int, max_seq: int,
                        prompt: int) -> int:
        """The larger of the bootstrap's votes and, on the reference path, a step's gathers.

        A prompt longer than the budget is voted on one (layer, sequence, KV head) at a time (window_votes):
        the head's keys widened to float32, its group's float32 logits over the window, their masked copy and
        its softmax, the causal mask and its negation, beside the layer's votes and their pooled copy. The
        reference step gathers the kept positions and the tail after them: since the observation window on a
        compressed prompt, the whole sequence on one the budget holds, rounded up to the default length bucket
        of a graphed step."""
        mc, keep = model_config, self.budget - self.window
        votes = 0
        if prompt > self.budget:
            widened = prompt * mc.head_dim * FLOAT32_BYTES if dtype_bytes != FLOAT32_BYTES else 0
            logits = mc.group_size * self.window * prompt * FLOAT32_BYTES
            votes = widened + 3 * logits + 2 * self.window * prompt + 2 * mc.num_kv_heads * prompt * FLOAT32_BYTES
        if path != "reference":
            return votes
        tail = bucketed_slots(max_seq - prompt + self.window if prompt > self.budget else max_seq, max_seq)
        gather = gather_attention_bytes(batch, mc.num_heads, mc.num_kv_heads, keep + tail, mc.head_dim, dtype_bytes)
        return max(votes, gather)

    def state_bytes(self, model_config, path: str, dtype_bytes: int, tile_rows: int) -> tuple[int, int]:
        mc, keep = model_config, self.budget - self.window
        positions = mc.num_layers * mc.num_kv_heads * keep * INDEX_BYTES
        if path != "optimized":
            return 0, positions
        rows = keep + min(-keep % tile_rows, self.window)  # OptimizedSnapKV.start's compact buffer
        return 0, positions + 2 * mc.num_layers * mc.num_kv_heads * rows * mc.head_dim * dtype_bytes


def window_votes(queries: torch.Tensor, keys: torch.Tensor, cfg: SnapKVConfig) -> torch.Tensor:
    """Pooled attention mass of the last `cfg.window` prompt queries `[H_q, W, D]` on each position before
    them, per KV head: keys `[H_kv, P, D]` of the whole P-token prompt -> `[H_kv, P - W]`."""
    window, (kv_heads, length, _) = cfg.window, keys.shape
    group, prefix = queries.shape[0] // kv_heads, length - window
    positions = torch.arange(length, device=keys.device)
    causal = positions[None, :] <= positions[prefix:, None]
    votes = torch.empty(kv_heads, prefix, dtype=torch.float32, device=keys.device)
    # One KV head at a time, its group's queries against its own keys: the float32 logits of a whole layer
    # (every query head x window x prompt) would be several GiB at 128K on a large model.
    for head in range(kv_heads):
        votes[head] = group_mass(queries[head * group:(head + 1) * group], keys[head], causal, prefix)
    pool = F.max_pool1d if cfg.pooling == "max" else F.avg_pool1d
    return pool(votes[:, None], cfg.kernel, stride=1, padding=cfg.kernel // 2)[:, 0]


def group_mass(queries: torch.Tensor, keys: torch.Tensor, causal: torch.Tensor, prefix: int) -> torch.Tensor:
    """The attention mass of one KV head's group of window queries `[G, W, D]` on each of its keys `[P, D]`
    before the window, averaged over the window rows and then the group -> `[P - W]`. (A function of its own,
    so one head's logits are freed before the next head's are made.)"""
    logits = torch.einsum("gwd,nd->gwn", queries.float(), keys.float()) * keys.shape[-1] ** -0.5
    weights = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)[..., :prefix]
    return weights.mean(dim=1).mean(dim=0)


class SnapKVRecall(RecallMemory):
    """The prompt positions SnapKV keeps and everything after them, at as many tokens per (layer, KV head)
    as the budget reference reads at the step: the observation window and every generated token, and of
    the older prompt positions the best by the window's votes (chosen once, from the prompt) to fill the
    rest."""

    names = ("snapkv",)
    labels = {"snapkv": "SnapKV"}

    def __init__(self, cfg: SnapKVConfig):
        self.cfg = cfg
        self.rank: torch.Tensor | None = None  # [layers, H_kv, P - W]: each older prompt position's rank

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        if view.budget is None or view.prompt_queries is None or view.keys is None:
            return None
        prompt, window, length = view.prompt_length, self.cfg.window, view.logits.shape[-1]
        if view.prompt_queries.shape[2] < window or prompt <= window:  # nothing older than the window
            return {"snapkv": torch.ones(view.key_norms.shape, dtype=torch.bool, device=view.logits.device)}
        if self.rank is None:
            votes = torch.stack([window_votes(view.prompt_queries[row, :, -window:], view.keys[row, :, :prompt],
                                              self.cfg) for row in range(view.keys.shape[0])])
            self.rank = votes.argsort(dim=-1, descending=True).argsort(dim=-1)
        prefix = prompt - window
        kept = self.rank < (view.budget - (length - prefix)).clamp_min(0)
        tail = torch.ones(kept.shape[:-1] + (length - prefix,), dtype=torch.bool, device=kept.device)
        return {"snapkv": torch.cat([kept, tail], dim=-1)}


class SnapKV(AttentionMethod):
    name = "snapkv"

    def __init__(self, config, model_config, tokenizer):
        super().__init__(config, model_config, tokenizer)
        cfg = config
        if cfg.pooling not in POOLINGS:
            raise ValueError(f"unknown SnapKV pooling {cfg.pooling!r}; valid: {', '.join(POOLINGS)}")
        if cfg.budget <= cfg.window:
            raise ValueError(f"SnapKV budget ({cfg.budget}) must exceed its observation window ({cfg.window})")
        if cfg.kernel % 2 == 0:
            raise ValueError(f"SnapKV pooling kernel must be odd, got {cfg.kernel}")

    def start(self, cache, prefilled) -> None:
        mc, keep = self.model_config, self.cfg.budget - self.cfg.window
        device = cache.k.device
        self.state("kept", (mc.num_layers, cache.batch, mc.num_kv_heads, keep), torch.long, device)
        self.state("kept_count", (cache.batch,), torch.long, device)
        self.state("tail_start", (cache.batch,), torch.long, device).copy_(prefilled.lengths)  # read from here on
        for row in range(cache.batch):
            length = int(prefilled.lengths[row])
            if length <= self.cfg.budget:  # the whole prompt fits: keep it all
                self.tail_start[row] = 0
                continue
            self.kept[:, row], self.tail_start[row] = self.keep(cache, prefilled, row)
            self.kept_count[row] = keep
        self.tail_start_host = self.tail_start.cpu()

    def keep(self, cache, prefilled, row: int) -> tuple[torch.Tensor, int]:
        """The best older prompt positions by the window's votes, per layer and KV head, and the observation
        window as the tail (the whole prompt as the tail where the budget holds it)."""
        mc, keep, length = self.model_config, self.cfg.budget - self.cfg.window, int(prefilled.lengths[row])
        if length <= self.cfg.budget:
            return torch.zeros(mc.num_layers, mc.num_kv_heads, 0, dtype=torch.long, device=cache.k.device), 0
        if int(prefilled.query_counts[row]) < self.cfg.window:
            raise ValueError(f"SnapKV needs the last {self.cfg.window} prompt queries; the engine kept "
                             f"{int(prefilled.query_counts[row])} (raise the engine's evidence_rows)")
        prefix = length - self.cfg.window
        kept = torch.empty(mc.num_layers, mc.num_kv_heads, keep, dtype=torch.long, device=cache.k.device)
        for layer in range(mc.num_layers):
            votes = self._votes(cache, prefilled, layer, row, prefix)
            kept[layer] = votes.topk(keep, dim=-1).indices.sort(dim=-1).values
        return kept, prefix

    def _votes(self, cache, prefilled, layer: int, row: int, prefix: int) -> torch.Tensor:
        count = int(prefilled.query_counts[row])
        q = prefilled.queries[layer, row, :, count - self.cfg.window:count]  # [H_q, W, D]
        return window_votes(q, cache.k[layer, row, :, :prefix + self.cfg.window], self.cfg)

    def plan(self, ctx) -> TailPlan:
        return TailPlan(tail_width=ctx.bucketed(int((ctx.kv_lengths_host - self.tail_start_host).max())))

    def attend(self, q: torch.Tensor, cache, ctx, plan: TailPlan) -> torch.Tensor:
        kept = self.kept[ctx.layer]
        valid = torch.arange(kept.shape[-1], device=q.device) < self.kept_count[:, None, None]
        out, read = attend_fixed_plus_tail(q, cache.k[ctx.layer], cache.v[ctx.layer], kept,
                                           valid.expand_as(kept), self.tail_start, ctx.kv_lengths,
                                           plan.tail_width)
        ctx.tokens_read[ctx.layer] = read
        return out


class OptimizedSnapKV(TwoSegmentPath, SnapKV):
    in_place = False  # the kept rows are the first slots of a compact cache, not a buffer of this method's

    def start(self, cache, prefilled) -> None:
        require_triton_device(cache.k.device)
        self.choose_splits(cache, self.cfg.budget)
        keep = self.cfg.budget - self.cfg.window
        # As SFI's refresh does (SelectionState._rebuild_compact): the kept rows are followed by the tail's
        # first rows up to a tile edge, and the tail is read after them: the same rows, no padded tile. A
        # compressed row's tail holds at least the observation window when this runs.
        moved = min(-keep % tile_rows(self.model_config.head_dim, cache.k.element_size()), self.cfg.window)
        self.in_place = cache.fixed_rows is not None
        if self.in_place:
            self.start_compact(cache, keep + moved)
            return
        super().start(cache, prefilled)  # chooses self.kept, self.kept_count and self.tail_start
        mc, device = self.model_config, cache.k.device
        compressed = (self.kept_count > 0).long() * moved  # [B]: rows that kept the whole prompt move nothing
        window = self.tail_start[None, :, None, None] + torch.arange(moved, device=device)  # [1, B, 1, moved]
        positions = torch.cat([self.kept, window.expand(mc.num_layers, -1, mc.num_kv_heads, -1)], dim=-1)
        shape = (1, mc.num_layers, cache.batch, mc.num_kv_heads, keep + moved, mc.head_dim)
        self.state("compact_k", shape, cache.k.dtype, device)
        self.state("compact_v", shape, cache.k.dtype, device)
        # (a row that kept its whole prompt reads no compact rows; its `window` may run past a short cache)
        index = positions.clamp(max=cache.max_seq - 1)[..., None].expand(-1, -1, -1, -1, mc.head_dim)
        # gathered straight into the buffers: a gathered copy beside them would double their bytes at the peak
        torch.gather(cache.k, 3, index, out=self.compact_k[0])  # [L, B, H_kv, keep + moved, D]
        torch.gather(cache.v, 3, index, out=self.compact_v[0])
        self.state("counts", (1, mc.num_layers, cache.batch, mc.num_kv_heads), torch.int32, device)
        self.counts.copy_((self.kept_count + compressed)[None, None, :, None].expand_as(self.counts))
        self.state("tail", (1, cache.batch), torch.int32, device).copy_((self.tail_start + compressed)[None])
        self.state("row_buffer", (cache.batch,), torch.int32, device)

    def plan(self, ctx):
        return AttentionMethod.plan(self, ctx)  # no static sizes: the kernel reads every length on the device

    def start_compact(self, cache, rows: int) -> None:
        """On a compact cache (engine/compact.py) a compressed row's first `rows` slots are its kept positions
        and the first rows of its observation window: the fixed segment, read in place; a row that kept its
        whole prompt reads it all as the tail."""
        mc, device = self.model_config, cache.k.device
        self.rows = rows
        first_tail = (cache.fixed_rows > 0).long() * rows  # [B]
        self.state("counts", (1, mc.num_layers, cache.batch, mc.num_kv_heads), torch.int32, device)
        self.counts.copy_(first_tail[None, None, :, None].expand_as(self.counts))
        self.state("tail", (1, cache.batch), torch.int32, device).copy_(first_tail[None])
        self.state("row_buffer", (cache.batch,), torch.int32, device)

    def compact(self, cache, layer: int):
        if self.in_place:
            return cache.k[layer, :, :, :self.rows][None], cache.v[layer, :, :, :self.rows][None]
        return self.compact_k[:, layer], self.compact_v[:, layer]


METHOD = MethodDef(name="snapkv", summary="prompt tokens kept once by the last prompt queries' votes, + the tail",
                   config=SnapKVConfig, paths={"reference": SnapKV, "optimized": OptimizedSnapKV})
