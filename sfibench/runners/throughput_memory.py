"""`sfibench throughput`'s memory plan: the estimate (metrics/memory.py) of a run of these methods, the
bytes it may plan with, and the largest batch that fits, asked of each method through the registry. Each
works from the model's shape alone, so a run is checked before its weights are allocated."""

from __future__ import annotations

import torch

from sfibench.core.device import available_device_memory, total_device_memory
from sfibench.core.parallel import launched_ranks
from sfibench.engine.compact import compact_slots
from sfibench.engine.method import MethodSpec
from sfibench.engine.session import Session
from sfibench.metrics.memory import (
    check_fits,
    estimate_memory,
    largest_batch,
    largest_context,
    planning_bytes,
    prompt_tokens,
)
from sfibench.optimized.decode_attention import tile_rows


def spec_bytes(spec: MethodSpec, dims, dtype_bytes: int, batch: int, max_seq: int, steps: int, *,
               compact: bool = True) -> dict:
    """RunShape's method fields for `spec` at this shape, `steps` of the `max_seq` slots decoded: its own
    MethodConfig.state_bytes and workspace_bytes, or where it keeps only part of each prompt (compact_slots)
    and the run gives it a compact cache (`compact`: the fixed-context mode does, request mode serves every
    method from the whole cache) its compact cache's slots and the workspace of its choice on one sequence
    (the prompts are prefilled one at a time). A compact method's state is the few integers per (layer,
    sequence, KV head) its kernel reads, not counted."""
    prompt = prompt_tokens(max_seq, steps)
    slots = compact_slots(spec.config, spec.path, dims, max_seq, max_seq - prompt) if compact else None
    if slots is not None:
        return {"method_token_bytes": 0, "method_sequence_bytes": 0, "compact_slots": slots,
                "method_workspace_bytes": spec.config.workspace_bytes(dims, spec.path, dtype_bytes, 1, max_seq, prompt)}
    token, sequence = spec.config.state_bytes(dims, spec.path, dtype_bytes, tile_rows(dims.head_dim, dtype_bytes))
    return {"method_token_bytes": token, "method_sequence_bytes": sequence, "compact_slots": 0,
            "method_workspace_bytes": spec.config.workspace_bytes(dims, spec.path, dtype_bytes, batch, max_seq, prompt)}


def method_bytes(specs: list[MethodSpec], dims, dtype_bytes: int, batch: int, max_seq: int, steps: int, *,
                 synthetic: bool, gpu: bool, compact: bool = True) -> dict:
    """RunShape's method fields of the run's largest method at this shape (one method runs at a time): the one
    whose estimate is the largest. `compact`: whether a method that keeps part of each prompt gets its compact
    cache (spec_bytes)."""
    def total(fields: dict) -> int:
        return estimate_memory(dims, batch, max_seq, dtype_bytes, synthetic_prefill=synthetic, gpu=gpu,
                               steps=steps, **fields)["total"]

    return max((spec_bytes(spec, dims, dtype_bytes, batch, max_seq, steps, compact=compact) for spec in specs),
               key=total)


def shape_estimate(dims, specs: list[MethodSpec], batch: int, max_seq: int, dtype_bytes: int, synthetic: bool,
                   gpu: bool, steps: int, *, compact: bool = True) -> dict:
    """The estimate of a run of `specs` on a model of shape `dims` (a ModelConfig) at this shape."""
    return estimate_memory(dims, batch, max_seq, dtype_bytes, synthetic_prefill=synthetic, gpu=gpu, steps=steps,
                           **method_bytes(specs, dims, dtype_bytes, batch, max_seq, steps, synthetic=synthetic,
                                          gpu=gpu, compact=compact))


def run_estimate(session: Session, specs: list[MethodSpec], batch: int, max_seq: int, synthetic: bool,
                 steps: int, *, compact: bool = True) -> dict:
    """The estimate of a run of `specs` at this shape, on the session's device."""
    return shape_estimate(session.loaded.config, specs, batch, max_seq, session.cache_dtype_bytes, synthetic,
                          session.device.type == "cuda", steps, compact=compact)


def planned_bytes(session: Session) -> int:
    """What a run on this session may plan to fill (metrics/memory.py's MARGIN of the device)."""
    return planning_bytes(total_device_memory(session.device), session.memory_for_estimate())


def planned_before_loading(device: torch.device) -> int:
    """What a run may plan to fill on `device` before its model loads: the estimate counts the weights, so
    the room is the device's free memory (plus the blocks torch's allocator already holds on a GPU); CPU
    ranks of a tensor-parallel run each plan with their share of the host's."""
    usable, total = available_device_memory(device), total_device_memory(device)
    if device.type == "cuda":
        usable += torch.cuda.memory_reserved(device)
    else:
        usable, total = usable // launched_ranks(), total // launched_ranks()
    return planning_bytes(total or usable, usable)


def check_shape_fits(dims, specs: list[MethodSpec], batch: int, max_seq: int, dtype_bytes: int, synthetic: bool,
                     gpu: bool, planned: int, steps: int, *, compact: bool = True) -> None:
    """MemoryEstimateError, one line naming the batch and the context that would fit with these methods,
    unless `batch` sequences of `max_seq` slots fit in `planned` bytes."""
    def method_at(sequences: int, slots: int) -> dict:
        return method_bytes(specs, dims, dtype_bytes, sequences, slots, steps, synthetic=synthetic, gpu=gpu,
                            compact=compact)

    check_fits(shape_estimate(dims, specs, batch, max_seq, dtype_bytes, synthetic, gpu, steps, compact=compact),
               planned, method_at)


def largest_fitting_batch(session: Session, specs: list[MethodSpec], max_seq: int, synthetic: bool,
                          steps: int, *, compact: bool = True) -> int:
    """The largest batch whose estimate fits the planned bytes at `max_seq` cache slots (0: none)."""
    dims, nbytes, gpu = session.loaded.config, session.cache_dtype_bytes, session.device.type == "cuda"

    def method_at(batch: int, slots: int) -> dict:
        return method_bytes(specs, dims, nbytes, batch, slots, steps, synthetic=synthetic, gpu=gpu, compact=compact)

    return largest_batch(run_estimate(session, specs, 1, max_seq, synthetic, steps, compact=compact),
                         planned_bytes(session), method_at)


def capacity(dims, specs: list[MethodSpec], dtype_bytes: int, gpu: bool, planned: int, steps: int,
             batches: list[int], contexts: list[int]) -> tuple[list[int], list[int | None]]:
    """What a run of `specs` with `steps` decode steps and a synthetic prefill fits in `planned` bytes: for
    each of `batches`, the longest prompt (0: not one token), and for each prompt length in `contexts`, the
    largest batch (0: not one sequence; None: beyond the model's limit)."""
    def method_at(batch: int, slots: int) -> dict:
        return method_bytes(specs, dims, dtype_bytes, batch, slots, steps, synthetic=True, gpu=gpu)

    longest = dims.max_context - steps  # what --ctx max gives
    widest = shape_estimate(dims, specs, 1, longest + steps + 1, dtype_bytes, True, gpu, steps)
    prompts = [max(largest_context(widest, batch, planned, method_at) - steps - 1, 0) for batch in batches]
    sequences = [largest_batch(shape_estimate(dims, specs, 1, context + steps + 1, dtype_bytes, True, gpu, steps),
                               planned, method_at) if context <= longest else None for context in contexts]
    return prompts, sequences
