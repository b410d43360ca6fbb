"""The engine's phases (load, prefill, graph capture, decode) as core/oom.py memory phases: what each asks
for, in a user's terms, and what would fit instead, from the KV cache's size per token (the part of a
run that grows with --batch and --ctx)."""

from __future__ import annotations

import torch

from sfibench.core.device import available_device_memory
from sfibench.core.oom import memory_phase
from sfibench.engine.workspace import FLOAT32_BYTES
from sfibench.models.presets import PRESETS, ModelConfig

GIB = 1 << 30


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.2f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):,.1f} MiB"


def _free(device: torch.device) -> int:
    try:
        return available_device_memory(device)
    except (RuntimeError, OSError):  # the device itself in trouble: say nothing rather than fail again
        return 0


def loading(model: str, device: torch.device, dtype: torch.dtype) -> memory_phase:
    def asked() -> str:
        preset = PRESETS.get(model)
        size = "" if preset is None else f", about {_gib(preset.num_params() * torch.finfo(dtype).bits // 8)}"
        return f"the weights of {model} in {str(dtype).removeprefix('torch.')}{size}"

    def fits() -> str:
        return (f"{device} has {_gib(_free(device))} free; use a smaller model or dtype (--dtype), free the "
                "memory other processes hold there, or use a device with more memory")

    return memory_phase("load", asked, fits)


def token_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """Bytes one token of one sequence takes in the cache: K and V in every layer, and the key norms."""
    return config.kv_bytes_per_token(dtype_bytes) + config.num_layers * config.num_kv_heads * FLOAT32_BYTES


def with_cache(phase: str, config: ModelConfig, batch: int, tokens: int, device: torch.device, dtype_bytes: int,
               held_bytes: int = 0, also: str = "") -> memory_phase:
    """A phase whose memory grows with batch x tokens. `held_bytes`: the KV cache already allocated, which a
    smaller run would reuse; `also`: a fix besides a smaller batch or context."""
    per_token = token_bytes(config, dtype_bytes)

    def asked() -> str:
        return (f"batch {batch} x {tokens:,} tokens of {config.name} (KV cache {_gib(batch * tokens * per_token)})")

    def fits() -> str:
        room = _free(device) + held_bytes
        most_tokens, most_batch = room // (batch * per_token), room // (tokens * per_token)
        if most_tokens < 1:
            return f"{device} has {_gib(room)} for the KV cache, not one token's worth; use a smaller model or dtype"
        options = [f"{most_tokens:,} tokens at batch {batch}"] + ([f"batch {most_batch:,} at {tokens:,} tokens"]
                                                                  if most_batch >= 1 else [])
        return (f"{device} has {_gib(room)} for the KV cache and the workspace, so at most {' or '.join(options)} "
                f"fit (less the workspace); lower --batch or --ctx{also}")

    return memory_phase(phase, asked, fits)


def on_cache(phase: str, cache, also: str = "") -> memory_phase:
    """with_cache for a phase that runs on an allocated KVCache (prefill into it, capture, decode)."""
    held = cache.k.nbytes + cache.v.nbytes + cache.key_norms.nbytes
    return with_cache(phase, cache.config, cache.batch, cache.max_seq, cache.k.device, cache.k.element_size(),
                      held, also)
