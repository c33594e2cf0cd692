"""FP8 e4m3 with 128x128 weight_scale_inv blocks: the dequant formula and a whole checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from backend.generate import logits_for
from backend.model import fp8
from backend.model.checkpoint import load_model
from backend.model.model import DeepseekV3ForCausalLM


@pytest.mark.parametrize("shape", [(256, 128), (128, 384), (576, 200), (100, 64), (130, 129)])
def test_dequantize_is_the_block_formula(shape: tuple[int, int]) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(*shape, generator=generator) * 4).to(fp8.FP8_DTYPE)
    grid = fp8.scale_shape(shape)
    scale_inv = torch.rand(*grid, generator=generator) + 0.5
    got = fp8.dequantize(weight, scale_inv)
    expected = torch.empty(shape)
    for bi in range(grid[0]):  # W[i, j] = W_fp8[i, j] * scale_inv[i // 128, j // 128]
        for bj in range(grid[1]):
            rows, cols = slice(bi * 128, (bi + 1) * 128), slice(bj * 128, (bj + 1) * 128)
            expected[rows, cols] = weight[rows, cols].float() * scale_inv[bi, bj]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_quantize_round_trip_and_power_of_two_scales() -> None:
    weight = torch.randn(576, 200, generator=torch.Generator().manual_seed(1))
    quantized, scale_inv = fp8.quantize(weight)
    assert quantized.dtype == fp8.FP8_DTYPE and scale_inv.shape == (5, 2)
    assert torch.equal(torch.exp2(torch.log2(scale_inv).round()), scale_inv)
    restored = fp8.dequantize(quantized, scale_inv)
    assert ((restored - weight).abs() / weight.abs().max()).max() < 0.07
    with pytest.raises(ValueError, match="scale_inv shape"):
        fp8.dequantize(quantized, scale_inv[:4])


def test_fp8_checkpoint_layout(tiny_fp8_dir: Path) -> None:
    shard = sorted(tiny_fp8_dir.glob("*.safetensors"))
    names: dict[str, torch.dtype] = {}
    for path in shard:
        with safe_open(path, framework="pt") as handle:
            names.update({n: handle.get_slice(n).get_dtype() for n in handle.keys()})  # noqa: SIM118
    assert names["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == "F8_E4M3"
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv" in names
    assert names["model.embed_tokens.weight"] == "BF16"
    assert names["model.layers.1.mlp.gate.e_score_correction_bias"] == "F32"


def test_fp8_checkpoint_logits_close_to_source(
    tiny_dir: Path, tiny_model: DeepseekV3ForCausalLM, tiny_fp8_dir: Path
) -> None:
    quantized = load_model(tiny_fp8_dir, dtype=torch.float32)
    prompt = torch.randint(0, 129280, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    fp8_logits = logits_for(quantized, prompt)
    # Exactly the source model with each FP8 weight put through quantize -> dequantize.
    round_tripped = load_model(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, tensor in round_tripped.state_dict().items():
            if (
                name.endswith(("_proj.weight", "_proj_with_mqa.weight"))
                and "shared_head" not in name
            ):
                tensor.copy_(fp8.dequantize(*fp8.quantize(tensor)))
    torch.testing.assert_close(fp8_logits, logits_for(round_tripped, prompt), rtol=0, atol=1e-4)
    # FP8 noise (about 3% per weight) stays bounded; MoE routing flips make it larger than that.
    source = logits_for(tiny_model, prompt)
    assert not torch.equal(source, fp8_logits)
    relative = (fp8_logits - source).norm() / source.norm()
    assert relative < 0.35, f"relative L2 error {relative:.3f}"
    agree = (fp8_logits.argmax(-1) == source.argmax(-1)).float().mean()
    assert agree > 0.5
