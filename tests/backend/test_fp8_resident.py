"""FP8 weights resident: an FP8 checkpoint's linears stay e4m3 after loading and compute by
dequantizing tile by tile on the CPU; results match the dequantize-at-load path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from backend.generate import generate_greedy, logits_for
from backend.kernels import fp8_gemm
from backend.model import fp8
from backend.model.checkpoint import load_model, read_index
from backend.model.fp8_linear import FP8Linear

PROMPT = torch.randint(0, 129280, (24,), generator=torch.Generator().manual_seed(5)).tolist()


def _linear_bytes(model: nn.Module) -> tuple[int, int]:
    """(weights, bytes) over every linear layer's weight (and FP8 scale grid)."""
    count = size = 0
    for module in model.modules():
        if isinstance(module, FP8Linear):
            count += module.weight.numel()
            size += module.weight.nbytes + module.weight_scale_inv.nbytes
        elif isinstance(module, nn.Linear):
            count += module.weight.numel()
            size += module.weight.nbytes
    return count, size


def test_fp8_linears_stay_fp8_after_loading(tiny_fp8_dir: Path) -> None:
    model = load_model(tiny_fp8_dir, dtype=torch.bfloat16)
    stored = {n for n, e in read_index(tiny_fp8_dir).items() if e.dtype == "F8_E4M3"}
    loaded = dict(model.named_modules())
    for name in stored:
        module = loaded.get(name.removesuffix(".weight"))
        if module is None:  # an MTP copy the model shares
            continue
        assert isinstance(module, FP8Linear), name
        assert module.weight.dtype == fp8.FP8_DTYPE
    dequantized = load_model(tiny_fp8_dir, dtype=torch.bfloat16, fp8_weights="dequantize")
    assert not any(isinstance(m, FP8Linear) for m in dequantized.modules())
    # The FP8 linears take one byte per weight plus their scale grids, half of bf16.
    _, resident_bytes = _linear_bytes(model)
    _, bf16_bytes = _linear_bytes(dequantized)
    lm_head_bytes = 2 * model.lm_head.weight.numel() * 2  # lm_head and the MTP head stay bf16
    assert resident_bytes - lm_head_bytes < 0.6 * (bf16_bytes - lm_head_bytes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resident_matches_dequantize_at_load(tiny_fp8_dir: Path, dtype: torch.dtype) -> None:
    """Stated tolerance: the same dequantized values, summed in another order; logits agree to
    1e-4 (fp32) or 2e-2 (bf16) and greedy continuations are identical."""
    resident = load_model(tiny_fp8_dir, dtype=dtype)
    at_load = load_model(tiny_fp8_dir, dtype=dtype, fp8_weights="dequantize")
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        logits_for(resident, PROMPT), logits_for(at_load, PROMPT), rtol=tolerance, atol=tolerance
    )
    assert generate_greedy(resident, PROMPT, 6) == generate_greedy(at_load, PROMPT, 6)


@pytest.mark.parametrize(("rows", "cols"), [(300, 200), (384, 256)])  # partial, whole blocks
def test_tiled_dequantization_matches_whole_weight(rows: int, cols: int) -> None:
    generator = torch.Generator().manual_seed(1)
    weight, scale_inv = fp8.quantize(torch.randn(rows, cols, generator=generator))
    x = torch.randn(3, cols, generator=generator)
    whole = x @ fp8.dequantize(weight, scale_inv).t()
    for tile_elements in (1, 128 * cols, 1 << 22):  # one scale row per band, several, all
        torch.testing.assert_close(
            fp8_gemm.linear_tiled(x, weight, scale_inv, tile_elements=tile_elements), whole
        )
    torch.testing.assert_close(fp8_gemm.linear_tiled(x[:1], weight, scale_inv), whole[:1])
    # bf16: the same bf16 weights as dequantizing at load, so the same products
    at_load = x.bfloat16() @ fp8.dequantize(weight, scale_inv, dtype=torch.bfloat16).t()
    torch.testing.assert_close(fp8_gemm.linear_tiled(x.bfloat16(), weight, scale_inv), at_load)


def test_unknown_fp8_mode_is_rejected(tiny_fp8_dir: Path) -> None:
    with pytest.raises(ValueError, match="fp8_weights"):
        load_model(tiny_fp8_dir, fp8_weights="bf16")  # type: ignore[arg-type]
