"""Quest (Tang et al., ICML 2024): per-step page retrieval from the full cache, by an upper bound of q.k.

The whole cache is kept. It is viewed in pages of 16 tokens, and per (layer, KV head, page) Quest keeps
the element-wise max M and min m of the page's cached (post-RoPE) keys, updated whenever a key is
written: at prefill, and at every decode append, the partial last page included. For a query q,
`sum_i max(q_i M_i, q_i m_i)` bounds q.k from above over every key of the page, so a page holding a key
with a large score cannot get a small bound. At every decode step each sparse layer reads the top
`budget / 16 - 1` pages by that bound plus the current (last, possibly partial) page; layers 0 and 1
read densely, as the authors run it, and so does prefill.

The paper's models are MHA. With GQA there is one page set per KV head, chosen by the bound summed over
the group's query heads (SGLang's port averages them, which selects the same pages). The authors' code
also reads at least 3 pages (their issue 22); that minimum is not part of the method and is not copied.
Bytes per step beyond the pages read: the metadata of every page, 2 key vectors per 16 tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sfibench.core.budget import BudgetError
from sfibench.engine.method import AttentionMethod, AttentionView, MethodConfig, MethodDef, RecallMemory, StepPlan
from sfibench.engine.workspace import FLOAT32_BYTES, INDEX_BYTES, gather_attention_bytes, keys_bytes
from sfibench.optimized.decode_attention import dense_decode, sparse_decode
from sfibench.optimized.retrieval_kernels import expand_positions, page_scores, page_scores_reference
from sfibench.optimized.top_k_kernels import top_k
from sfibench.optimized.triton_device import require_triton_device
from sfibench.reference.attention import dense_attention
from sfibench.reference.sparse_memory import attend_fixed_plus_tail


@dataclass(frozen=True)
class QuestConfig(MethodConfig):
    """Page retrieval at every step (SPEC 6); the budget is tokens read per (layer, KV head) in sparse layers."""

    page: int = 16
    budget: int = 2308  # SFI's default 4 + 2048 + 256: (budget // page - 1) pages + the current one
    dense_layers: int = 2  # the first layers read densely

    @property
    def pages(self) -> int:
        """Pages chosen by their bound at each step, besides the current page."""
        return self.budget // self.page - 1

    def with_budget(self, budget: int) -> QuestConfig:
        if budget < 2 * self.page:
            raise BudgetError(f"a budget of {budget} tokens is less than Quest's two {self.page}-token pages "
                              "(one chosen, the current one); raise it")
        return dataclasses.replace(self, budget=budget)

    def tokens_read(self, context: int) -> int:
        """Tokens a sparse layer reads at `context`: the chosen pages and the current page's tokens."""
        current = (context - 1) % self.page + 1
        full_pages = (context - current) // self.page
        return min(self.pages, full_pages) * self.page + current

    def state_bytes(self, model_config, path: str, dtype_bytes: int, tile_rows: int) -> tuple[int, int]:
        """Two bound vectors per (layer, KV head, page); the optimized path adds a float32 score per (KV
        head, page) and the int64 slot list of the pages it reads."""
        mc = model_config
        per_page = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * dtype_bytes
        if path != "optimized":
            return -(-per_page // self.page), 0
        slots = mc.num_kv_heads * (self.pages + 1) * self.page * INDEX_BYTES
        return -(-(per_page + mc.num_kv_heads * FLOAT32_BYTES) // self.page), slots

    def workspace_bytes(self, model_config, path: str, dtype_bytes: int, batch: int, max_seq: int,
                        prompt: int) -> int:
        """Both paths bound the prompt's pages one (layer, sequence) at a time (`page_bounds`: a padded copy
        of its keys and its masked copy, beside its new bounds). The reference step also scores
        every page in float32 (the bounds widened, a score per page and query head) and gathers the pages
        it reads."""
        mc = model_config
        if not self.sparse_layers(mc):
            return 0  # every layer reads densely
        pages = -(-max_seq // self.page)
        keys = keys_bytes(1, mc.num_kv_heads, pages * self.page, mc.head_dim, dtype_bytes)
        bounds = 2 * keys_bytes(1, mc.num_kv_heads, pages, mc.head_dim, dtype_bytes)
        bootstrap = 2 * keys + bounds + pages * self.page
        if path != "reference":
            return bootstrap
        widened = 2 * keys_bytes(batch, mc.num_kv_heads, pages, mc.head_dim, FLOAT32_BYTES) \
            if dtype_bytes != FLOAT32_BYTES else 0
        scoring = batch * mc.num_heads * pages * FLOAT32_BYTES + widened
        read = min(self.pages * self.page + self.page, max_seq)
        gather = gather_attention_bytes(batch, mc.num_heads, mc.num_kv_heads, read, mc.head_dim, dtype_bytes)
        return max(bootstrap, scoring, gather)

    def sparse_layers(self, model_config) -> list[int]:
        """The layers that choose pages: the global layers after the first `dense_layers`."""
        return [layer for layer in model_config.global_layers if layer >= self.dense_layers]

    def step_bytes(self, model_config, context: int, dtype_bytes: int) -> float:
        """The page metadata every sparse layer reads to score the pages: M and m of every page."""
        mc = model_config
        sparse = len(self.sparse_layers(mc))
        return sparse * mc.num_kv_heads * -(-context // self.page) * 2 * mc.head_dim * dtype_bytes

    def recall_memory(self, selection_budget) -> RecallMemory:
        return QuestRecall(self)


@dataclass(frozen=True)
class QuestPlan(StepPlan):
    capacity: int = 0  # slots the dense layers read (the longest length, bucketed)
    masked: bool = False  # some sequence is shorter than the capacity


def page_bounds(keys: torch.Tensor, lengths: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Element-wise max and min of the keys of every page: keys `[B, H_kv, S, D]` -> two `[B, H_kv, P, D]`.

    Slots at or past a sequence's length do not count (an empty page's bounds are -inf / +inf)."""
    batch, heads, slots, dim = keys.shape
    pages = -(-slots // page)
    padded = torch.nn.functional.pad(keys, (0, 0, 0, pages * page - slots)).view(batch, heads, pages, page, dim)
    valid = (torch.arange(pages * page, device=keys.device) < lengths[:, None]).view(batch, 1, pages, page, 1)
    highest = padded.masked_fill(~valid, float("-inf")).amax(dim=3)
    lowest = padded.masked_fill(~valid, float("inf")).amin(dim=3)
    return highest, lowest


def choose_pages(scores: torch.Tensor, kv_lengths: torch.Tensor, page: int, count: int) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """The top `count` pages by score (only pages before the current one have a finite score): page indices
    `[B, H_kv, count]` and whether each is real (a sequence with fewer full pages reads them all)."""
    count = min(count, scores.shape[-1])
    chosen = scores.topk(count, dim=-1).indices
    return chosen, chosen < ((kv_lengths - 1) // page)[:, None, None]


class QuestRecall(RecallMemory):
    """The pages a Quest step reads, at as many tokens per (layer, KV head) as the budget reference reads
    there: the first `dense_layers` layers read everything; every other layer the top (budget // page - 1)
    pages before the current one by their bound, plus the current page. A sliding-window layer counts as a
    global one here, as it does in every memory the analysis compares.

    Successive views are the steps of one sequence, whose cached keys never change: as Quest keeps its
    page bounds current on every write, only the pages not yet full are summarised again at a step."""

    names = ("quest",)
    labels = {"quest": "Quest"}

    def __init__(self, cfg: QuestConfig):
        self.cfg = cfg
        self.highest = self.lowest = None  # [layers, H_kv, pages, D]: the bounds of the keys seen so far

    def bounds(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        page, length = self.cfg.page, keys.shape[2]
        kept = 0 if self.highest is None else self.highest.shape[2] - 1  # the last page may have been partial
        kept = kept if kept * page <= length else 0
        rest = torch.full((keys.shape[0],), length - kept * page, device=keys.device)
        highest, lowest = page_bounds(keys[:, :, kept * page:], rest, page)  # the layers stand in for the batch
        self.highest = torch.cat([self.highest[:, :, :kept], highest], dim=2) if kept else highest
        self.lowest = torch.cat([self.lowest[:, :, :kept], lowest], dim=2) if kept else lowest
        return self.highest, self.lowest

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        if view.budget is None or view.queries is None or view.keys is None:
            return None
        cfg, keys = self.cfg, view.keys
        layers, kv_heads, length, dim = keys.shape
        highest, lowest = self.bounds(keys)
        group = view.queries.float().view(layers, kv_heads, -1, dim)
        # max(q_i M_i, q_i m_i) is q_i M_i where q_i >= 0 and q_i m_i elsewhere (M >= m), so the bound summed
        # over the group is two products with the group's summed positive and negative parts
        scores = (torch.einsum("lhd,lhpd->lhp", group.clamp(min=0).sum(dim=2), highest.float())
                  + torch.einsum("lhd,lhpd->lhp", group.clamp(max=0).sum(dim=2), lowest.float()))
        current = (length - 1) // cfg.page
        scores[..., current:] = float("-inf")  # only the pages before the current one are chosen by bound
        pages = (view.budget // cfg.page - 1).clamp_min(0)
        rank = scores.argsort(dim=-1, descending=True).argsort(dim=-1)
        chosen = (rank < pages) & scores.isfinite()
        positions = torch.arange(length, device=keys.device)
        mask = chosen.repeat_interleave(cfg.page, dim=-1)[..., :length] | (positions >= current * cfg.page)
        dense = [row for row, layer in enumerate(view.layer_ids()) if layer < cfg.dense_layers]
        mask[dense] = True
        return {"quest": mask}


class Quest(AttentionMethod):
    name = "quest"

    def __init__(self, config, model_config, tokenizer):
        super().__init__(config, model_config, tokenizer)
        if config.pages < 1:
            raise ValueError(f"Quest budget ({config.budget}) must hold a chosen page beside the current one "
                             f"({2 * config.page} tokens)")

    def start(self, cache, prefilled) -> None:
        mc, cfg = self.model_config, self.cfg
        shape = (mc.num_layers, cache.batch, mc.num_kv_heads, -(-cache.max_seq // cfg.page), mc.head_dim)
        self.state("highest", shape, cache.k.dtype, cache.k.device)
        self.state("lowest", shape, cache.k.dtype, cache.k.device)
        lengths = prefilled.lengths.to(cache.k.device)
        for layer in self.sparse_layers():  # one sequence at a time: page_bounds copies the keys it bounds
            for row in range(cache.batch):
                one = slice(row, row + 1)
                self.highest[layer, one], self.lowest[layer, one] = page_bounds(cache.k[layer, one], lengths[one],
                                                                                cfg.page)

    def sparse_layers(self) -> list[int]:
        return self.cfg.sparse_layers(self.model_config)

    def plan(self, ctx) -> QuestPlan:
        capacity = ctx.bucketed(int(ctx.kv_lengths_host.max()))
        return QuestPlan(capacity=capacity, masked=bool((ctx.kv_lengths_host != capacity).any()))

    def attend(self, q: torch.Tensor, cache, ctx, plan: QuestPlan) -> torch.Tensor:
        layer, cfg = ctx.layer, self.cfg
        k, v = cache.k[layer], cache.v[layer]
        if layer < cfg.dense_layers:
            ctx.tokens_read[layer] = ctx.kv_lengths[:, None]
            return dense_attention(q, k, v, ctx.kv_lengths, plan.capacity, plan.masked)
        # fold this step's key into its page's bounds, then score the pages before the current one
        scores = page_scores_reference(q[:, :, 0], self.highest[layer], self.lowest[layer], k, ctx.kv_lengths,
                                       cfg.page)
        chosen, real = choose_pages(scores, ctx.kv_lengths, cfg.page, cfg.pages)
        offsets = torch.arange(cfg.page, device=q.device)
        fixed = (chosen[..., None] * cfg.page + offsets).flatten(2).clamp(max=k.shape[2] - 1)  # [B, H_kv, n]
        fixed_valid = real[..., None].expand(-1, -1, -1, cfg.page).flatten(2)
        current = (ctx.kv_lengths - 1) // cfg.page * cfg.page
        out, read = attend_fixed_plus_tail(q, k, v, fixed, fixed_valid, current, ctx.kv_lengths, cfg.page)
        ctx.tokens_read[layer] = read
        return out


class OptimizedQuest(Quest):
    """Per sparse layer: one launch scores the pages (and folds the new key into its page's bounds), one
    ranks them (optimized/top_k_kernels.top_k: a program per sequence and KV head), one lists their
    slots and the current page's, and the split-K decode kernel reads those slots in place in the cache.
    Nothing is sized on the host, so one CUDA graph serves every step."""

    def start(self, cache, prefilled) -> None:
        require_triton_device(cache.k.device)
        super().start(cache, prefilled)
        mc, cfg, device = self.model_config, self.cfg, cache.k.device
        pages = self.highest.shape[3]
        self.chosen_pages = min(cfg.pages, pages)
        self.state("scores", (cache.batch, mc.num_kv_heads, pages), torch.float32, device)
        self.state("positions", (cache.batch, mc.num_kv_heads, (self.chosen_pages + 1) * cfg.page), torch.long,
                   device)

    def plan(self, ctx) -> StepPlan:
        return StepPlan()  # every length is read on the device

    def attend(self, q: torch.Tensor, cache, ctx, plan) -> torch.Tensor:
        layer, cfg = ctx.layer, self.cfg
        k, v = cache.k[layer], cache.v[layer]
        if layer < cfg.dense_layers:
            ctx.tokens_read[layer] = ctx.kv_lengths[:, None]
            return dense_decode(q[:, :, 0], k, v, ctx.kv_lengths, index_before_wait=True)[:, :, None]
        page_scores(q[:, :, 0], self.highest[layer], self.lowest[layer], k, ctx.kv_lengths, cfg.page,
                    out=self.scores)
        chosen = top_k(self.scores, self.chosen_pages, 0)  # ascending: the real pages first
        expand_positions(chosen, ctx.kv_lengths, cfg.page, self.positions, ctx.tokens_read[layer])
        return sparse_decode(q[:, :, 0], k, v, self.positions, ctx.tokens_read[layer])[:, :, None]


METHOD = MethodDef(name="quest", summary="every step, the pages whose key bounds score highest (+ the current)",
                   config=QuestConfig, paths={"reference": Quest, "optimized": OptimizedQuest})
