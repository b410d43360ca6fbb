"""Static, preallocated KV cache shared by every method.

Layout `[n_layers, B, H_kv, S_max, D]` for K and V, plus the L2 norm of every cached key (the SFI
prior reads them at each refresh; caching them costs one float per key instead of a pass over K).
The cache is append-only: decoding writes only at slots >= the prompt length, so a prefilled prompt
stays intact and "restoring a snapshot" is just resetting the lengths (see Prefilled in engine/).

A slot holds the token at the same position, except in a compact cache (engine/compact.py), which keeps
only the prompt positions a method reads: there `fixed_rows[b]` slots of chosen positions come first, and
from slot `fixed_rows[b]` on each slot holds position slot + `position_offset[b]` (the kept tail of the
prompt, then every generated token). Keys keep the RoPE of their original positions either way.
"""

from __future__ import annotations

import torch

from sfibench.engine.memory_phases import with_cache
from sfibench.models import fused
from sfibench.models.presets import ModelConfig


class KVCache:
    def __init__(self, config: ModelConfig, batch: int, max_seq: int, device, dtype: torch.dtype):
        shape = (config.num_layers, batch, config.num_kv_heads, max_seq, config.head_dim)
        with with_cache("prefill", config, batch, max_seq, torch.device(device), torch.finfo(dtype).bits // 8):
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
            self.key_norms = torch.zeros(shape[:-1], device=device, dtype=torch.float32)
        self.config = config
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.lengths_host = torch.zeros(batch, dtype=torch.long)  # mirror: sizes without a device sync
        self.max_seq = max_seq
        self.position_offset: torch.Tensor | None = None  # [B] on the device: set in a compact cache only
        self.fixed_rows: torch.Tensor | None = None  # [B] on the device: set in a compact cache only

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def set_lengths(self, lengths: torch.Tensor) -> None:
        self.lengths.copy_(lengths)
        self.lengths_host.copy_(lengths.cpu())

    def advance(self) -> None:
        """Every sequence appended one token."""
        self.lengths += 1
        self.lengths_host += 1

    def write_chunk(self, layer: int, row: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Prefill: keys/values `[H_kv, T, D]` of one sequence go to slots [start, start + T)."""
        end = start + k.shape[1]
        self.k[layer, row, :, start:end] = k
        self.v[layer, row, :, start:end] = v
        self.key_norms[layer, row, :, start:end] = k.float().norm(dim=-1)

    def write_step(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Decode: one key/value `[B, H_kv, D]` per sequence, each at its own slot `positions[b]`.

        One kernel with fusion on (see models/fused.py), where plain torch takes five.
        """
        fused.ops["append_kv"](self.k[layer], self.v[layer], self.key_norms[layer], positions, k, v)
