"""Rotary position embeddings, with the frequency rescalings long-context checkpoints use.

`inverse_frequencies` returns the per-pair rotation speeds and an amplitude factor (YaRN scales cos
and sin by it); the rotation itself is `fused.apply_rope`.
"""

from __future__ import annotations

import math

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return base, 1.0
    factor = float(scaling["factor"])
    if kind == "linear":  # positions squeezed uniformly into the trained range
        return base / factor, 1.0
    if kind == "llama3":
        return _llama3(base, factor, scaling), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, factor, scaling)
    raise ValueError(f"unsupported rope scaling {kind!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


def _llama3(base: torch.Tensor, factor: float, scaling: dict) -> torch.Tensor:
    """Slow the low frequencies by `factor`, keep the high ones, blend smoothly in between."""
    trained = scaling["original_max_position_embeddings"]
    low_wavelen = trained / scaling.get("low_freq_factor", 1.0)
    high_wavelen = trained / scaling.get("high_freq_factor", 4.0)
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / factor, base)
    smooth = (trained / wavelen - scaling.get("low_freq_factor", 1.0)) / (
        scaling.get("high_freq_factor", 4.0) - scaling.get("low_freq_factor", 1.0)
    )
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_between, blended, scaled)


def _yarn(head_dim: int, theta: float, factor: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """Interpolate low frequencies, extrapolate high ones, ramp linearly between (YaRN)."""
    trained = scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)

    def dim_for_rotations(rotations: float) -> float:
        return head_dim * math.log(trained / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dim_for_rotations(beta_fast)), 0)
    high = min(math.ceil(dim_for_rotations(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    interpolated = extrapolated / factor
    keep_extrapolated = 1 - ramp
    inv_freq = interpolated * (1 - keep_extrapolated) + extrapolated * keep_extrapolated
    attention_factor = scaling.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return inv_freq, float(attention_factor)


def rope_cos_sin(inv_freq: torch.Tensor, amplitude: float, positions: torch.Tensor, dtype: torch.dtype):
    """cos/sin `[B, T, D]` for integer positions `[B, T]` (computed in float32, then cast)."""
    angles = positions.float().unsqueeze(-1) * inv_freq.to(positions.device)
    angles = torch.cat((angles, angles), dim=-1)
    return (angles.cos() * amplitude).to(dtype), (angles.sin() * amplitude).to(dtype)


class PositionTable:
    """cos/sin of every position below `length`, computed once by rope_cos_sin, then gathered.

    A decode step's RoPE table is eight small element-wise launches (multiply, concatenate, cos, sin,
    scale, casts); gathered from this table it is one, with the same values (the same element-wise ops
    on the same inputs, done once for all positions). Tables are kept per (frequencies, amplitude,
    dtype, device): a layer's (cos, sin) are views into `[length, 2, D]`. The frequencies are known by
    their address (reading their values would synchronise a GPU every step), so each entry holds its
    frequency tensor: while it is cached, no other tensor can be given that address."""

    def __init__(self):
        self.tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (inv_freq, table)

    def __call__(self, inv_freq: torch.Tensor, amplitude: float, positions: torch.Tensor, dtype: torch.dtype,
                 length: int) -> tuple[torch.Tensor, torch.Tensor]:
        pair = self.table(inv_freq, amplitude, dtype, length)[positions]  # [B, T, 2, D]; a position >= length
        return pair[..., 0, :], pair[..., 1, :]  # fails loudly (index out of range)

    def table(self, inv_freq: torch.Tensor, amplitude: float, dtype: torch.dtype,
              length: int) -> torch.Tensor:
        """cos/sin of positions [0, length) as `[length, 2, D]`, on inv_freq's device, built on first use."""
        key = (str(inv_freq.device), inv_freq.data_ptr(), amplitude, dtype, length)
        if key not in self.tables:
            every = torch.arange(length, device=inv_freq.device)[None]
            cos, sin = rope_cos_sin(inv_freq, amplitude, every, dtype)
            self.tables[key] = (inv_freq, torch.stack([cos[0], sin[0]], dim=1))
        return self.tables[key][1]
