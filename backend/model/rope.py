"""Rotary position embedding with YaRN frequency scaling, in DeepSeek's interleaved layout.

DeepSeek rotates adjacent pairs (x[2i], x[2i+1]) by angle position * inv_freq[i]. With YaRN the
dimensions whose wavelength fits ``beta_fast`` or more rotations in the original context keep their
frequency, those with fewer than ``beta_slow`` rotations are divided by ``factor``, and a linear
ramp blends the range between (the correction range, computed from the config).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from backend.model.config import RopeConfig, yarn_mscale


def correction_range(rope: RopeConfig, dim: int) -> tuple[int, int]:
    """Pair indices [low, high] where YaRN blends extrapolated and interpolated frequencies."""
    original = rope.original_max_position_embeddings
    assert original is not None

    def dim_for(rotations: float) -> float:
        wavelength_ratio = original / (rotations * 2 * math.pi)
        return dim * math.log(wavelength_ratio) / (2 * math.log(rope.theta))

    low = math.floor(dim_for(rope.beta_fast))
    high = math.ceil(dim_for(rope.beta_slow))
    return max(low, 0), min(high, dim - 1)


def inv_frequencies(rope: RopeConfig, dim: int, device: torch.device | str = "cpu") -> Tensor:
    """[dim // 2] fp32 inverse frequencies, YaRN-corrected when the config says so."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim
    base = 1.0 / (rope.theta**exponents)
    if not rope.is_yarn:
        return base
    low, high = correction_range(rope, dim)
    span = max(high - low, 1e-3)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / span).clamp(0, 1)
    keep = 1.0 - ramp  # 1: original frequency, 0: divided by factor
    return base / rope.factor * (1.0 - keep) + base * keep


def cos_sin_scale(rope: RopeConfig) -> float:
    """YaRN's factor on cos and sin: mscale(factor, mscale) / mscale(factor, mscale_all_dim)."""
    if not rope.is_yarn:
        return 1.0
    return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)


class Rotary:
    """A model's rotary frequencies and YaRN scale, computed once (kept per device, since the
    model's weights may be filled on another device than it was built on)."""

    def __init__(self, rope: RopeConfig, dim: int) -> None:
        self._inv_freq = {"cpu": inv_frequencies(rope, dim)}
        self._scale = cos_sin_scale(rope)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin, each [T, dim // 2] fp32, for the absolute ``positions`` [T]."""
        device = str(positions.device)
        inv_freq = self._inv_freq.get(device)
        if inv_freq is None:
            inv_freq = self._inv_freq[device] = self._inv_freq["cpu"].to(positions.device)
        angles = positions.float()[:, None] * inv_freq[None, :]
        return angles.cos() * self._scale, angles.sin() * self._scale


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate interleaved pairs of ``x`` [T, ..., dim] by cos/sin [T, dim // 2]; same layout out."""
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[-1]]
    cos, sin = cos.view(shape), sin.view(shape)
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
    return rotated.flatten(-2).to(x.dtype)
