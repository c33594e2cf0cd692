"""Fused MoE kernels against their torch reference and against the model's own MoE layer."""

from __future__ import annotations

import pytest
import torch

from backend.kernels import fused_moe
from backend.model import fp8
from backend.model.checkpoint import load_model
from backend.model.moe import MoE

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

EXPERTS, DIM, INTER, TOP_K = 4, 64, 96, 2
DECODE_TILES = fused_moe.MoETiles(16, 32, 64, 4, 2)
PREFILL_TILES = fused_moe.MoETiles(32, 64, 128, 4, 2)


def _experts(quantized: bool) -> fused_moe.StackedExperts:
    generator = torch.Generator().manual_seed(0)
    w13 = torch.randn(EXPERTS, 2 * INTER, DIM, generator=generator) / DIM**0.5
    w2 = torch.randn(EXPERTS, DIM, INTER, generator=generator) / INTER**0.5
    if not quantized:
        return fused_moe.StackedExperts(w13, w2)
    q13, s13, q2, s2 = [], [], [], []
    for e in range(EXPERTS):  # gate and up quantized apart, as the checkpoint stores them
        gate, gate_scale = fp8.quantize(w13[e, :INTER])
        up, up_scale = fp8.quantize(w13[e, INTER:])
        down, down_scale = fp8.quantize(w2[e])
        q13.append(torch.cat((gate, up)))
        s13.append(torch.cat((gate_scale, up_scale)))
        q2.append(down)
        s2.append(down_scale)
    return fused_moe.StackedExperts(
        torch.stack(q13), torch.stack(q2), torch.stack(s13), torch.stack(s2)
    )


def _to(experts: fused_moe.StackedExperts, device: torch.device) -> fused_moe.StackedExperts:
    return fused_moe.StackedExperts(
        *(None if t is None else t.to(device) for t in vars(experts).values())
    )


def _routing(num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack(
        [torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(num_tokens)]
    )
    return torch.rand(num_tokens, TOP_K, generator=generator), ids


def test_align_by_expert_groups_every_pair_once() -> None:
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]])
    layout = fused_moe.align_by_expert(ids, num_experts=4, block_m=4)
    pairs = layout.pairs.view(-1, 4)
    real = layout.pairs[layout.pairs < 6]
    assert sorted(real.tolist()) == list(range(6))
    for block, expert in enumerate(layout.block_expert.tolist()):
        members = [p for p in pairs[block].tolist() if p < 6]
        if expert < 0:
            assert not members
        else:
            assert members and all(ids.flatten()[p] == expert for p in members)


@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize(
    ("num_tokens", "tiles"), [(1, DECODE_TILES), (9, DECODE_TILES), (40, PREFILL_TILES)]
)
def test_kernel_matches_reference(
    device: torch.device,
    act_dtype: torch.dtype,
    quantized: bool,
    num_tokens: int,
    tiles: fused_moe.MoETiles,
) -> None:
    experts = _experts(quantized)
    if not quantized:
        experts = fused_moe.StackedExperts(experts.w13.to(act_dtype), experts.w2.to(act_dtype))
    weights, ids = _routing(num_tokens)
    x = torch.randn(num_tokens, DIM, generator=torch.Generator().manual_seed(1)).to(act_dtype)
    expected = fused_moe.fused_moe_reference(x.float(), experts, weights, ids)
    got = fused_moe.fused_moe(
        x.to(device), _to(experts, device), weights.to(device), ids.to(device), tiles
    )
    assert got.dtype == act_dtype
    tolerance = 3e-2 if act_dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float().cpu(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("checkpoint", ["tiny_dir", "tiny_fp8_dir"])
@torch.inference_mode()
def test_packed_model_layer_matches_its_module_path(
    device: torch.device, checkpoint: str, request: pytest.FixtureRequest
) -> None:
    """A real MoE layer: packing keeps its outputs, and the fused kernel over the packed
    experts equals the per-expert module path (bf16 storage and FP8 resident)."""
    model = load_model(request.getfixturevalue(checkpoint), dtype=torch.float32)
    moe = model.model.layers[1].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(6, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    before = moe(x)
    stacked = moe.pack_experts()
    assert (stacked.w13_scale is not None) == (checkpoint == "tiny_fp8_dir")
    assert stacked.w13.data_ptr() == moe.experts[0].gate_proj.weight.data_ptr()
    torch.testing.assert_close(moe(x), before, rtol=0, atol=0)
    weights, ids = moe.gate(x)
    shared = moe.shared_experts(x) if moe.shared_experts is not None else 0
    routed = fused_moe.fused_moe(
        x.to(device), _to(stacked, device), weights.to(device), ids.to(device)
    )
    torch.testing.assert_close(routed.cpu() + shared, before, rtol=1e-5, atol=1e-5)


def test_wrapper_rejects_bad_inputs(device: torch.device) -> None:
    experts = _to(_experts(quantized=True), device)
    weights, ids = _routing(2)
    weights, ids = weights.to(device), ids.to(device)
    x = torch.randn(2, DIM, device=device)
    with pytest.raises(ValueError, match="shapes disagree"):
        fused_moe.fused_moe(x[:, :32], experts, weights, ids)
    with pytest.raises(ValueError, match="both be"):
        fused_moe.fused_moe(x, experts, weights[:, :1], ids)
    unscaled = fused_moe.StackedExperts(experts.w13, experts.w2)
    with pytest.raises(ValueError, match="scale grids"):
        fused_moe.fused_moe(x, unscaled, weights, ids)
    assert experts.w2_scale is not None
    bad = fused_moe.StackedExperts(
        experts.w13, experts.w2, experts.w13_scale, experts.w2_scale[:, :0]
    )
    with pytest.raises(ValueError, match="w2_scale"):
        fused_moe.fused_moe(x, bad, weights, ids)
