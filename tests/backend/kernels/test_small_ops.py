"""The fused small kernels (RMSNorm with the residual add, SiLU x up) against their torch
references: under Triton's interpreter on tiny shapes on the CPU, on the GPU where present."""

from __future__ import annotations

import pytest
import torch

from backend.kernels.small_ops import (
    add_rms_norm,
    add_rms_norm_reference,
    silu_mul,
    silu_mul_reference,
    write_latents,
    write_latents_reference,
)

pytestmark = pytest.mark.triton


@pytest.mark.parametrize(("tokens", "width"), [(1, 16), (5, 24), (3, 100), (0, 8)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_the_reference(
    device: torch.device, act_dtype: torch.dtype, tokens: int, width: int, with_residual: bool
) -> None:
    gen = torch.Generator().manual_seed(tokens * 100 + width)
    x = torch.randn(tokens, width, generator=gen).to(device, act_dtype)
    residual = torch.randn(tokens, width, generator=gen).to(device, act_dtype)
    weight = (1 + 0.1 * torch.randn(width, generator=gen)).to(device, act_dtype)
    r = residual if with_residual else None
    out, h = add_rms_norm(x, weight, 1e-6, r)
    want_out, want_h = add_rms_norm_reference(x, weight, 1e-6, r)
    tolerance = 1e-5 if act_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(h, want_h, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(out, want_out, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("tokens", "width"), [(1, 8), (4, 40), (2, 1500)])
def test_silu_mul_matches_the_reference(
    device: torch.device, act_dtype: torch.dtype, tokens: int, width: int
) -> None:
    gen = torch.Generator().manual_seed(width)
    gate = (3 * torch.randn(tokens, width, generator=gen)).to(device, act_dtype)
    up = torch.randn(tokens, width, generator=gen).to(device, act_dtype)
    tolerance = 1e-5 if act_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        silu_mul(gate, up), silu_mul_reference(gate, up), rtol=tolerance, atol=tolerance
    )


def test_the_wrappers_refuse_bad_inputs(device: torch.device, act_dtype: torch.dtype) -> None:
    x = torch.zeros(2, 8, device=device, dtype=act_dtype)
    with pytest.raises(ValueError, match="weight must be"):
        add_rms_norm(x, torch.ones(7, device=device, dtype=act_dtype), 1e-6)
    with pytest.raises(ValueError, match="residual must match"):
        add_rms_norm(x, torch.ones(8, device=device, dtype=act_dtype), 1e-6, x[:1])
    with pytest.raises(ValueError, match="unit stride"):
        add_rms_norm(x.t(), torch.ones(2, device=device, dtype=act_dtype), 1e-6)
    with pytest.raises(ValueError, match="alike"):
        silu_mul(x, x[:, :4])
    with pytest.raises(ValueError, match="unit stride"):
        silu_mul(x.t(), x.t())


@pytest.mark.parametrize(("tokens", "lora", "rope"), [(1, 16, 8), (6, 24, 6), (0, 8, 4)])
def test_write_latents_matches_the_reference(
    device: torch.device, act_dtype: torch.dtype, tokens: int, lora: int, rope: int
) -> None:
    gen = torch.Generator().manual_seed(tokens + lora)
    kv = torch.randn(tokens, lora + rope, generator=gen).to(device, act_dtype)
    weight = (1 + 0.1 * torch.randn(lora, generator=gen)).to(device, act_dtype)
    angles = torch.rand(tokens, rope // 2, generator=gen) * 6
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    slots = torch.randperm(20, generator=gen)[:tokens].to(device)
    fused = torch.zeros(20, lora + rope, device=device, dtype=act_dtype)
    unfused = torch.zeros_like(fused)
    write_latents(kv, weight, 1e-6, cos, sin, fused, slots)
    write_latents_reference(kv, weight, 1e-6, cos, sin, unfused, slots)
    tolerance = 1e-5 if act_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fused, unfused, rtol=tolerance, atol=tolerance)
    with pytest.raises(ValueError, match="cos and sin must be"):
        write_latents(kv, weight, 1e-6, cos[:, :1], sin[:, :1], fused, slots)
