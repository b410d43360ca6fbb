"""The one decode-step driver: every command and test decodes through `StepDriver.step`.

A step is: the method plans it on the host (`plan`, which also fills the method's device inputs),
the model runs one token per sequence (each layer appends its K/V to the cache, then the method
attends; a sliding-window layer attends its window itself, see engine/sliding.py), the method's
`after_step` hook runs (where an SFI slow step hands its evidence to the refresh pipeline), and the
cache advances.

At decode, an eager engine measures Python and kernel-launch overhead, not attention (SPEC 7), so on
a GPU the model call is replayed from a CUDA graph, one per distinct plan (the plan is frozen and
hashable: it is the graph key). A graph reads every tensor at the address it saw at capture, so the
step's inputs live in static buffers owned here (token ids, KV lengths, tokens read) and are filled
in place; nothing is allocated on a replay.

A caller whose own model runs the layers (sfibench.hf, inside a transformers forward) makes a driver
without a model and calls the step's phases itself (open_step, begin_layers, attend per layer,
close_step): the same step, with the model's layers instead of the engine's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sfibench.core.labels import label
from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.memory_phases import on_cache
from sfibench.engine.method import AttentionMethod, StepPlan
from sfibench.engine.prefill import Prefilled, restore
from sfibench.engine.sliding import window_decode_attention, window_tokens_read
from sfibench.engine.workspace import LENGTH_BUCKET
from sfibench.models.decoder import Decoder


@dataclass
class StepResult:
    logits: torch.Tensor  # [B, V]; on a replay this is the graph's output buffer: copy it to keep it
    ctx: StepContext
    replayed: bool


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class StepDriver:
    def __init__(self, model: Decoder | None, cache: KVCache, method: AttentionMethod, use_graphs: bool = False,
                 length_bucket: int = LENGTH_BUCKET):
        device = cache.k.device
        if use_graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; run with --no-graphs on this machine")
        self.model, self.cache, self.method = model, cache, method
        self.use_graphs = use_graphs
        self.length_bucket = length_bucket if use_graphs else 1
        cfg = cache.config
        self.tokens = torch.zeros(cache.batch, dtype=torch.long, device=device)
        self.kv_lengths = torch.zeros(cache.batch, dtype=torch.long, device=device)
        self.tokens_read = torch.zeros(cfg.num_layers, cache.batch, cfg.num_kv_heads, dtype=torch.long,
                                       device=device)
        # a compact cache's slots are not positions (engine/compact.py): the step's RoPE positions, made per step
        self.rope_positions = None if cache.position_offset is None else torch.zeros_like(self.kv_lengths)
        self.graphs: dict[StepPlan, _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.capture_seconds = 0.0
        self.step_index = 0
        self.decoding = on_cache("decode", cache)  # made once: it is entered on every step

    def start(self, prefilled: Prefilled) -> None:
        """Rewind the cache to the prefilled prompts and let the method start on them (its bootstrap)."""
        restore(self.cache, prefilled)
        with self.decoding:  # the method's bootstrap: its first selection and buffers
            self.method.start(self.cache, prefilled)
        self.step_index = 0

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> StepResult:
        """Feed `tokens [B]` (one per sequence) at each sequence's next position."""
        with self.decoding:
            return self._step(tokens)

    def _step(self, tokens: torch.Tensor) -> StepResult:
        ctx, plan = self.open_step(tokens)
        replayed = self.use_graphs and plan.graphable
        if replayed:
            captured = self.graphs.get(plan) or self._capture(plan, ctx)
            captured.graph.replay()
            logits = captured.logits
        else:
            logits = self._forward(ctx, plan)
        self.close_step(ctx, plan)
        return StepResult(logits, ctx, replayed)

    # A step in phases, so that a caller whose own model runs the layers (sfibench.hf, inside a transformers
    # forward) drives the same step: open_step, begin_layers, attend for each layer, close_step.
    def open_step(self, tokens: torch.Tensor) -> tuple[StepContext, StepPlan]:
        """Host side, before the model runs: the step's context and the method's plan for input `tokens [B]`."""
        self.step_index += 1
        ctx = StepContext(step=self.step_index, positions=self.cache.lengths, kv_lengths=self.kv_lengths,
                          kv_lengths_host=self.cache.lengths_host + 1,
                          slow=torch.zeros(self.cache.batch, dtype=torch.bool), tokens_read=self.tokens_read,
                          length_bucket=self.length_bucket)
        plan = self.method.plan(ctx)
        self.tokens.copy_(tokens, non_blocking=True)
        return ctx, plan

    def begin_layers(self, ctx: StepContext, plan: StepPlan) -> None:
        """Device side, before the first layer (captured with the step)."""
        torch.add(self.cache.lengths, 1, out=self.kv_lengths)
        if self.rope_positions is not None:
            torch.add(self.cache.lengths, self.cache.position_offset, out=self.rope_positions)
        self.method.begin_step(ctx, plan)

    def attend(self, ctx: StepContext, plan: StepPlan, layer: int, q: torch.Tensor, k: torch.Tensor | None,
               v: torch.Tensor | None) -> torch.Tensor:
        """Layer `layer`'s decode attention: append its k/v `[B, H_kv, 1, D]` (None: the layer appended them
        itself), then a sliding layer attends its window, whatever the method, and every other layer the method's
        positions."""
        cfg = self.cache.config
        ctx.layer = layer
        if k is not None:
            self.cache.write_step(layer, ctx.positions, k[:, :, 0], v[:, :, 0])
        with label("sfibench.attend"):  # a label for `sfibench profile`
            if not cfg.is_global(layer):
                ctx.tokens_read[layer] = window_tokens_read(ctx.kv_lengths, cfg.sliding_window)[:, None]
                return window_decode_attention(q, self.cache.k[layer], self.cache.v[layer], ctx.kv_lengths,
                                               cfg.sliding_window)
            return self.method.attend(q, self.cache, ctx, plan)

    def close_step(self, ctx: StepContext, plan: StepPlan) -> None:
        """Host side, after the step was launched: the method's after_step (an SFI refresh), then the cache
        advances."""
        self.method.after_step(ctx, plan)
        self.cache.advance()

    def _forward(self, ctx: StepContext, plan: StepPlan) -> torch.Tensor:
        self.begin_layers(ctx, plan)

        def attend(layer, q, k, v):
            return self.attend(ctx, plan, layer, q, k, v)

        # Where each layer's new k/v go: the decoder appends them in the kernel that rotates k (one
        # launch fewer per layer than rotating, then appending).
        attend.append_target = lambda layer: (self.cache.k[layer], self.cache.v[layer], self.cache.key_norms[layer],
                                              ctx.positions)
        positions = ctx.positions if self.rope_positions is None else self.rope_positions
        return self.model(self.tokens[:, None], positions[:, None], attend)[:, -1]

    def _capture(self, plan: StepPlan, ctx: StepContext) -> _Captured:
        with on_cache("graph capture", self.cache, also=", or decode without CUDA graphs (--no-graphs)"):
            return self._capture_graph(plan, ctx)

    def _capture_graph(self, plan: StepPlan, ctx: StepContext) -> _Captured:
        started = time.perf_counter()
        # Warm up on a side stream first: lazy initialisation (cuBLAS handles, Triton compilation)
        # must not happen inside a capture. Writing this step's K/V twice is harmless.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(ctx, plan)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(ctx, plan)
        self.graphs[plan] = _Captured(graph, logits)
        self.capture_seconds += time.perf_counter() - started
        return self.graphs[plan]
