"""The model wired to the kernels: an FP8-resident tiny model whose linears, MoE layers and
decode attention go through the Triton wrappers gives the torch path's logits and tokens.

On CUDA the kernels are chosen by the device; on the CPU the test switches them on (the
interpreter runs them), which is how the wiring is checked on a machine without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.generate import generate_greedy, logits_for
from backend.kernels import support
from backend.model.checkpoint import load_model
from backend.model.moe import MoE

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

PROMPT = [5, 17, 300, 42, 9, 1000]


def test_model_through_kernels_matches_torch_path(
    tiny_fp8_dir: Path,
    device: torch.device,
    act_dtype: torch.dtype,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference = load_model(tiny_fp8_dir, dtype=act_dtype)
    expected_logits = logits_for(reference, PROMPT)
    expected_tokens = generate_greedy(reference, PROMPT, 3)
    if device.type == "cpu":
        monkeypatch.setattr(support, "use_kernels", lambda tensor: True)
    model = load_model(tiny_fp8_dir, dtype=act_dtype, device=device)
    moe_layers = [m for m in model.modules() if isinstance(m, MoE)]
    assert moe_layers and all(m.stacked is not None for m in moe_layers)
    logits = logits_for(model, PROMPT).cpu()
    if act_dtype == torch.float32:
        torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)
        assert generate_greedy(model, PROMPT, 3) == expected_tokens
    else:  # bf16 on CUDA: other summation orders and roundings than the CPU path
        relative = (logits - expected_logits).norm() / expected_logits.norm()
        assert relative < 0.05, f"relative L2 error {relative:.3f}"
