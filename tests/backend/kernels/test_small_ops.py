"""The fused small kernels (RMSNorm with the residual add, SiLU x up) against their torch
references: under Triton's interpreter on tiny shapes on the CPU, on the GPU where present."""

from __future__ import annotations

import pytest
import torch

from backend.kernels.small_ops import (
    add_rms_norm,
    add_rms_norm_reference,
    route,
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


@pytest.mark.parametrize(
    ("tokens", "n_group", "per_group", "topk_group", "top_k", "normalize"),
    [(5, 4, 8, 2, 3, True), (3, 8, 4, 8, 4, False), (4, 1, 16, 1, 2, True), (0, 2, 4, 1, 2, True)],
)
def test_route_chooses_as_noaux_tc(
    device: torch.device,
    tokens: int,
    n_group: int,
    per_group: int,
    topk_group: int,
    top_k: int,
    normalize: bool,
) -> None:
    from backend.model.config import MoEConfig
    from backend.model.moe import route_noaux_tc

    experts = n_group * per_group
    moe = MoEConfig(
        n_routed_experts=experts, num_experts_per_tok=top_k, n_group=n_group,
        topk_group=topk_group, n_shared_experts=0, moe_intermediate_size=8,
        routed_scaling_factor=2.5, norm_topk_prob=normalize, first_k_dense_replace=0,
        moe_layer_freq=1,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(experts + tokens)
    logits = torch.randn(tokens, experts, generator=gen)
    logits[:, 3] = logits[:, 5] if tokens else logits[:, 3]  # a tie: the lower index wins
    bias = 0.1 * torch.randn(experts, generator=gen)
    want_w, want_ids = route_noaux_tc(logits, bias, moe)
    got_w, got_ids = route(
        logits.to(device), bias.to(device), n_group, topk_group, top_k, normalize, 2.5
    )
    assert got_ids.cpu().tolist() == want_ids.tolist()
    torch.testing.assert_close(got_w.cpu(), want_w, rtol=1e-5, atol=1e-6)
