"""Block-scaled FP8 GEMM kernels (weight-only and W8A8) against their torch references."""

from __future__ import annotations

import pytest
import torch

from backend.kernels import fp8_gemm
from backend.model import fp8

pytest.importorskip("triton")
pytestmark = pytest.mark.triton


def _weight(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return fp8.quantize(torch.randn(rows, cols, generator=generator) / cols**0.5)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}


def test_act_quant_matches_reference(device: torch.device) -> None:
    # 200 columns: a full group of 128 and a partial one; values straddle e4m3 rounding ties.
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(0)) * 5
    q, scale = fp8_gemm.act_quant(x.to(device))
    q_ref, scale_ref = fp8_gemm.act_quant_reference(x)
    assert q.dtype == fp8.FP8_DTYPE and scale.shape == (3, 2)
    torch.testing.assert_close(scale.cpu(), scale_ref)
    assert torch.equal(q.cpu().float(), q_ref.float())
    restored = fp8_gemm.act_dequant_reference(q_ref, scale_ref)
    assert ((restored - x).abs() / x.abs().amax()).max() < 0.07


@pytest.mark.parametrize(("m", "n", "k"), [(1, 130, 200), (5, 256, 128), (70, 130, 256)])
def test_weight_only_matches_tiled_reference(
    device: torch.device, act_dtype: torch.dtype, m: int, n: int, k: int
) -> None:
    weight, scale_inv = _weight(n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(act_dtype)
    expected = fp8_gemm.linear_tiled(x.float(), weight, scale_inv)
    got = fp8_gemm.fp8_linear(
        x.to(device), weight.to(device), scale_inv.to(device), quantize_activations=False
    )
    assert got.dtype == act_dtype and got.shape == (m, n)
    torch.testing.assert_close(got.float().cpu(), expected, **_tolerance(act_dtype))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 130, 200), (70, 256, 256)])
def test_w8a8_matches_reference(
    device: torch.device, act_dtype: torch.dtype, m: int, n: int, k: int
) -> None:
    weight, scale_inv = _weight(n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2)).to(act_dtype)
    expected = fp8_gemm.w8a8_reference(x.float(), weight, scale_inv)
    got = fp8_gemm.fp8_linear(
        x.to(device), weight.to(device), scale_inv.to(device), quantize_activations=True
    )
    torch.testing.assert_close(got.float().cpu(), expected, **_tolerance(act_dtype))
    # Activation quantization costs accuracy against the exact product, but boundedly.
    exact = x.float() @ fp8.dequantize(weight, scale_inv).t()
    assert (got.float().cpu() - exact).norm() / exact.norm() < 0.05


def test_wrapper_rejects_bad_inputs(device: torch.device) -> None:
    weight, scale_inv = _weight(128, 128, seed=0)
    weight, scale_inv = weight.to(device), scale_inv.to(device)
    x = torch.randn(2, 128, device=device)
    with pytest.raises(ValueError, match="columns"):
        fp8_gemm.fp8_linear(x[:, :64], weight, scale_inv, quantize_activations=False)
    with pytest.raises(ValueError, match="scale_inv"):
        fp8_gemm.fp8_linear(x, weight, scale_inv[:, :0], quantize_activations=False)
    with pytest.raises(ValueError, match="weight must be"):
        fp8_gemm.fp8_linear(x, weight.float(), scale_inv, quantize_activations=False)
    with pytest.raises(ValueError, match="unit stride"):
        strided = torch.randn(128, 2, device=device).t()  # [2, 128], column stride 2
        fp8_gemm.fp8_linear(strided, weight, scale_inv, quantize_activations=False)
    tiles = fp8_gemm.GemmTiles(16, 64, 96, 4, 2)
    with pytest.raises(ValueError, match="block_k"):
        fp8_gemm.fp8_linear(x, weight, scale_inv, quantize_activations=False, tiles=tiles)
