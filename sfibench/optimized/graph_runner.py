"""Decode steps as CUDA-graph replays.

At decode, an eager engine measures Python and kernel-launch overhead, not attention (SPEC 7), so
speed runs replay each step from a CUDA graph. A graph freezes every host-side value seen while it
was captured; the method names those values in `graph_key`, and one graph is kept per key (static
sizes are rounded up to a length bucket, so a handful of graphs cover a growing context). Steps
the method cannot capture (SFI's slow steps, whose Selector sizes follow the context) run eagerly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.decode import forward_step
from sfibench.methods import AttentionMethod
from sfibench.models.decoder import Decoder


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor
    tokens_read: torch.Tensor


class DecodeRunner:
    def __init__(self, model: Decoder, cache: KVCache, method: AttentionMethod, use_graphs: bool,
                 length_bucket: int = 256):
        if use_graphs and cache.k.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; run with --no-graphs on this machine")
        self.model, self.cache, self.method = model, cache, method
        self.use_graphs = use_graphs
        self.length_bucket = length_bucket if use_graphs else 1
        self.tokens = torch.zeros(cache.batch, dtype=torch.long, device=cache.k.device)  # graph input
        self.graphs: dict[tuple, _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.capture_seconds = 0.0

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, step: int) -> tuple[torch.Tensor, StepContext, bool]:
        """Run decode step `step` on `tokens [B]`; returns (logits, context, whether it was replayed)."""
        cfg = self.model.config
        ctx = StepContext.for_decode(step, self.cache.lengths, self.cache.lengths_host, cfg.num_layers,
                                     cfg.num_kv_heads, self.length_bucket)
        self.method.plan_step(ctx)
        key = self.method.graph_key(ctx) if self.use_graphs else None
        self.tokens.copy_(tokens, non_blocking=True)
        if key is None:
            logits = forward_step(self.model, self.cache, self.method, self.tokens, ctx)
        else:
            captured = self.graphs.get(key) or self._capture(key, ctx)
            captured.graph.replay()
            logits, ctx.tokens_read = captured.logits, captured.tokens_read
        self.cache.advance()
        return logits, ctx, key is not None

    def _capture(self, key: tuple, ctx: StepContext) -> _Captured:
        started = time.perf_counter()
        # Warm up on a side stream first: lazy initialisation (cuBLAS handles, Triton compilation)
        # must not happen inside a capture. Writing this step's K/V twice is harmless.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward_step(self.model, self.cache, self.method, self.tokens, self._graph_context(ctx))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            captured_ctx = self._graph_context(ctx)
            logits = forward_step(self.model, self.cache, self.method, self.tokens, captured_ctx)
        self.graphs[key] = _Captured(graph, logits, captured_ctx.tokens_read)
        self.capture_seconds += time.perf_counter() - started
        return self.graphs[key]

    def _graph_context(self, ctx: StepContext) -> StepContext:
        """The step context with device values derived inside the graph from the cache's lengths."""
        return StepContext(step=ctx.step, positions=self.cache.lengths, kv_lengths=self.cache.lengths + 1,
                           kv_lengths_host=ctx.kv_lengths_host, slow=ctx.slow,
                           tokens_read=torch.zeros_like(ctx.tokens_read), length_bucket=ctx.length_bucket)
