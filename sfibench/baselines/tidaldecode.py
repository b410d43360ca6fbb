"""TidalDecode (Yang et al., ICLR 2025): token selection in two layers of a step, reused by the others.

The whole cache is kept. At every decode step the first layers read densely; the selection layer (layer
2) reads densely too, and takes the exact top-k token positions of its q.K scores per KV head (the
group's query heads' scores summed); one re-selection layer in the middle of the stack (the authors'
layer 13 of 32, scaled to the model's depth) does the same again; every other layer reads the positions
chosen by the last selection layer before it, plus the current token. The selection layers' dense reads
count in the tokens read. Only global layers select or reuse (a sliding-window layer reads its window). A
model too shallow to hold a selection layer after its dense ones reads densely in every layer: TidalDecode
is Full-KV there, and its rows say so by the tokens they read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sfibench.core.budget import BudgetError
from sfibench.engine.method import AttentionMethod, AttentionView, MethodConfig, MethodDef, RecallMemory, StepPlan
from sfibench.optimized.decode_attention import dense_decode, sparse_decode
from sfibench.optimized.retrieval_kernels import expand_positions, token_scores
from sfibench.optimized.top_k_kernels import top_k
from sfibench.optimized.triton_device import require_triton_device
from sfibench.reference.attention import dense_attention
from sfibench.reference.sparse_memory import attend_fixed_plus_tail


@dataclass(frozen=True)
class TidalDecodeConfig(MethodConfig):
    """Selection layers and the tokens the other layers read (SPEC 6)."""

    budget: int = 2308  # tokens a reusing layer reads per KV head: budget - 1 selected + the current token
    dense_layers: int = 2  # the first layers read densely
    selection_layer: int = 2
    reselection_fraction: float | None = 13 / 32  # the authors' layer 13 of 32, scaled to the model's depth;
    #                                              None: layer `selection_layer` alone selects

    def with_budget(self, budget: int) -> TidalDecodeConfig:
        if budget < 2:
            raise BudgetError(f"a budget of {budget} tokens leaves TidalDecode no selected token beside the "
                              "current one; raise it")
        return dataclasses.replace(self, budget=budget)

    def tokens_read(self, context: int) -> int:
        """Tokens a reusing layer reads at `context`."""
        return min(self.budget, context)

    def state_bytes(self, model_config, path: str, dtype_bytes: int, tile_rows: int) -> tuple[int, int]:
        return 0, model_config.num_kv_heads * max(self.budget - 1, 1) * (8 + 1)  # int64 positions + valid flags

    def selection_layers(self, model_config) -> list[int]:
        """The layers that select: the first global layers at or after `selection_layer` and at or after the
        scaled middle of the stack."""
        globals_ = [layer for layer in model_config.global_layers if layer >= self.dense_layers]
        wanted = [self.selection_layer]
        if self.reselection_fraction is not None:
            wanted.append(max(round(self.reselection_fraction * model_config.num_layers), self.selection_layer + 1))
        picked = [next((layer for layer in globals_ if layer >= at), None) for at in wanted]
        return sorted({layer for layer in picked if layer is not None})

    def recall_memory(self, selection_budget) -> RecallMemory:
        return TidalDecodeRecall(self)


class TidalDecodeRecall(RecallMemory):
    """The tokens a TidalDecode step reads, at as many per (layer, KV head) as the budget reference reads
    there: the first layers, those before the first selection layer and the selection layers read
    everything; every other layer reads the current token and the older positions its last selection layer
    ranks highest, as many as the budget leaves beside the current token. A selection layer ranks by its G
    query heads' logits summed, which ranks as their q.k summed: a logit is q.k times one positive scale
    (no supported model soft-caps attention logits). A sliding-window layer counts as a global one here, as
    it does in every memory the analysis compares."""

    names = ("tidaldecode",)
    labels = {"tidaldecode": "TidalDecode"}

    def __init__(self, cfg: TidalDecodeConfig):
        self.cfg = cfg

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        if view.budget is None or view.model_config is None:
            return None
        logits, layers = view.logits, view.layer_ids()
        length = logits.shape[-1]
        selecting = self.cfg.selection_layers(view.model_config)
        mask = torch.ones(len(layers), logits.shape[1], length, dtype=torch.bool, device=logits.device)
        rank, ranked_by = None, None  # the older positions ranked by a selection layer's summed logits
        for row, layer in enumerate(layers):
            if not selecting or layer < selecting[0]:
                continue  # read densely
            if layer in selecting:
                older = logits[row, ..., :length - 1].sum(dim=1)  # [H_kv, L - 1]
                rank, ranked_by = older.argsort(dim=-1, descending=True).argsort(dim=-1), layer
            elif ranked_by != max(s for s in selecting if s < layer):
                return None  # the view leaves out the selection layer this one reuses
            else:
                mask[row, :, :length - 1] = rank < view.budget[row] - 1
        return {"tidaldecode": mask}


@dataclass(frozen=True)
class TidalPlan(StepPlan):
    capacity: int = 0  # slots the dense and selection layers read (the longest length, bucketed)
    masked: bool = False


class TidalDecode(AttentionMethod):
    name = "tidaldecode"

    def __init__(self, config, model_config, tokenizer):
        super().__init__(config, model_config, tokenizer)
        self.selecting = config.selection_layers(model_config)
        # the first layers, the layers before the first selection and the selection layers read everything
        first = self.selecting[0] if self.selecting else model_config.num_layers
        self.reads_densely = set(range(max(config.dense_layers, first))) | set(self.selecting)

    def start(self, cache, prefilled) -> None:
        mc = self.model_config
        chosen = max(self.cfg.budget - 1, 1)
        self.state("chosen", (cache.batch, mc.num_kv_heads, chosen), torch.long, cache.k.device)
        self.state("chosen_valid", (cache.batch, mc.num_kv_heads, chosen), torch.bool, cache.k.device)

    def plan(self, ctx) -> TidalPlan:
        capacity = ctx.bucketed(int(ctx.kv_lengths_host.max()))
        return TidalPlan(capacity=capacity, masked=bool((ctx.kv_lengths_host != capacity).any()))

    def select(self, q: torch.Tensor, keys: torch.Tensor, kv_lengths: torch.Tensor, capacity: int) -> None:
        """Top-k positions of the group-summed q.k scores per KV head, the current token excluded."""
        batch, q_heads, dim = q.shape
        capacity = min(capacity, keys.shape[2])
        kv_heads = keys.shape[1]
        grouped = q.float().view(batch, kv_heads, q_heads // kv_heads, dim)
        scores = torch.einsum("bhgd,bhnd->bhn", grouped, keys[:, :, :capacity].float())
        older = torch.arange(capacity, device=q.device) < (kv_lengths - 1)[:, None]  # [B, N]
        scores = scores.masked_fill(~older[:, None], float("-inf"))
        count = min(self.chosen.shape[-1], capacity)
        top = scores.topk(count, dim=-1).indices
        self.chosen.zero_()
        self.chosen_valid.zero_()
        self.chosen[..., :count] = top
        self.chosen_valid[..., :count] = top < (kv_lengths - 1)[:, None, None]

    def attend(self, q: torch.Tensor, cache, ctx, plan: TidalPlan) -> torch.Tensor:
        layer = ctx.layer
        k, v = cache.k[layer], cache.v[layer]
        if layer in self.reads_densely:
            if layer in self.selecting:
                self.select(q[:, :, 0], k, ctx.kv_lengths, plan.capacity)
            ctx.tokens_read[layer] = ctx.kv_lengths[:, None]
            return dense_attention(q, k, v, ctx.kv_lengths, plan.capacity, plan.masked)
        out, read = attend_fixed_plus_tail(q, k, v, self.chosen, self.chosen_valid, ctx.kv_lengths - 1,
                                           ctx.kv_lengths, 1)
        ctx.tokens_read[layer] = read
        return out


class OptimizedTidalDecode(TidalDecode):
    """A selection layer: one launch scores every older slot (the group's q summed, then one dot per key),
    the top-k ranks them (one launch up to 16K slots, the radix select beyond), one launch lists them and
    the current slot, and the layer itself reads densely with the split-K kernel. Every other sparse layer
    reads the listed slots in place. Nothing is sized on the host, so one CUDA graph serves every step."""

    def start(self, cache, prefilled) -> None:
        require_triton_device(cache.k.device)
        mc, device = self.model_config, cache.k.device
        self.chosen_tokens = min(max(self.cfg.budget - 1, 1), cache.max_seq)
        self.state("scores", (cache.batch, mc.num_kv_heads, cache.max_seq), torch.float32, device)
        self.state("positions", (cache.batch, mc.num_kv_heads, self.chosen_tokens + 1), torch.long, device)
        self.state("counts", (cache.batch, mc.num_kv_heads), torch.long, device)

    def plan(self, ctx) -> StepPlan:
        return StepPlan()  # every length is read on the device

    def attend(self, q: torch.Tensor, cache, ctx, plan) -> torch.Tensor:
        layer = ctx.layer
        k, v = cache.k[layer], cache.v[layer]
        if layer in self.reads_densely:
            if layer in self.selecting:
                token_scores(q[:, :, 0], k, ctx.kv_lengths, out=self.scores)
                chosen = top_k(self.scores, self.chosen_tokens, 0)  # ascending: the older slots first
                expand_positions(chosen, ctx.kv_lengths, 1, self.positions, self.counts)
            ctx.tokens_read[layer] = ctx.kv_lengths[:, None]
            return dense_decode(q[:, :, 0], k, v, ctx.kv_lengths, index_before_wait=True)[:, :, None]
        ctx.tokens_read[layer] = self.counts
        return sparse_decode(q[:, :, 0], k, v, self.positions, self.counts)[:, :, None]


METHOD = MethodDef(name="tidaldecode", summary="every step, top-k tokens chosen in two layers, reused by the rest",
                   config=TidalDecodeConfig, paths={"reference": TidalDecode, "optimized": OptimizedTidalDecode})
